package mover

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/controller/reason"
)

// The seed's copy is one CreateVolume lasting hours, so it runs in its own
// goroutine, not a worker: a worker held for hours would leave a stopped
// workload's catch-up or roll back waiting. A call that ends before the copy
// leaves it running on the node, where repeats answer ABORTED with
// moveapi.ErrorCopyInProgress; that is progress, spends no retry, and is
// waited for up to copyBusyLimit.

const (
	// seedSlots is how many seed copies run at once.
	seedSlots = workers
	// seedAnswerWait lets a volume made already, or a refusal, be answered in
	// the step that starts the call.
	seedAnswerWait = 2 * time.Second
	// copyBusyLimit is how long the node may answer that the copy still runs:
	// its copyTimeout plus an hour for the final sync and marking.
	copyBusyLimit = copyTimeout + time.Hour
)

// seedCopies are the seed copies of moves in seeding, by old PV. The work
// queue syncs a key on one worker at a time, so each seedCopy is touched by
// one worker and its call's goroutine, which closes done.
type seedCopies struct {
	mu    sync.Mutex
	moves map[string]*seedCopy
	slots chan struct{}
}

func newSeedCopies() *seedCopies {
	return &seedCopies{moves: map[string]*seedCopy{}, slots: make(chan struct{}, seedSlots)}
}

// seedCopy is one move's seed copy: the call in flight and earlier answers.
type seedCopy struct {
	// seed is the seed's ID: a copy of another move's seed is not this one's.
	seed     string
	call     *seedCall
	failures int
	// busySince is when the node began answering that the copy still runs.
	busySince time.Time
}

type seedCall struct {
	started time.Time
	done    chan struct{}
	resp    *csi.CreateVolumeResponse
	err     error
	cancel  context.CancelFunc
}

// of is pv's copy from seed; one of another seed is dropped.
func (s *seedCopies) of(pv, seed string) *seedCopy {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.moves[pv]
	if c != nil && c.seed != seed {
		if c.call != nil {
			c.call.cancel()
		}
		c = nil
	}
	if c == nil {
		c = &seedCopy{seed: seed}
		s.moves[pv] = c
	}
	return c
}

// drop forgets pv's copy and cancels its call.
func (s *seedCopies) drop(pv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.moves[pv]; c != nil && c.call != nil {
		c.call.cancel()
	}
	delete(s.moves, pv)
}

// start runs create in its own goroutine when a slot is free.
func (s *seedCopies) start(ctx context.Context, c *seedCopy, now time.Time, create func(context.Context) (*csi.CreateVolumeResponse, error)) bool {
	select {
	case s.slots <- struct{}{}:
	default:
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, copyTimeout)
	call := &seedCall{started: now, done: make(chan struct{}), cancel: cancel}
	c.call = call
	go func() {
		defer func() { <-s.slots }()
		defer cancel()
		call.resp, call.err = create(cctx)
		close(call.done)
	}()
	return true
}

// copySeed makes the target from its seed: the answer, or how long to wait.
// An error is retried with backoff.
func (m *Mover) copySeed(ctx context.Context, mv move, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, time.Duration, error) {
	c := m.seeds.of(mv.pv.Name, mv.pv.Annotations[moveapi.AnnSeed])
	wait := time.Duration(0)
	if c.call == nil {
		create := func(cctx context.Context) (*csi.CreateVolumeResponse, error) {
			return m.cfg.Volumes.CreateVolume(cctx, req)
		}
		if !m.seeds.start(ctx, c, m.now(), create) {
			m.wait(ctx, mv, fmt.Sprintf("waiting to copy the seed to node %s: %d seed copies run already", mv.to, seedSlots))
			return nil, m.cfg.Poll, nil
		}
		wait = m.seedWait
	}
	if !answered(ctx, c.call.done, wait) {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		m.wait(ctx, mv, fmt.Sprintf("copying the seed to node %s (this call since %s)", mv.to, c.call.started.UTC().Format(time.RFC3339)))
		return nil, m.cfg.Poll, nil
	}
	resp, err := c.call.resp, c.call.err
	c.call = nil
	if err == nil {
		m.seeds.drop(mv.pv.Name)
		return resp, 0, nil
	}
	if reason.CopyInProgress(err) {
		now := m.now()
		if c.busySince.IsZero() {
			c.busySince = now
		}
		if now.Sub(c.busySince) < copyBusyLimit {
			m.wait(ctx, mv, fmt.Sprintf("node %s is still copying the seed (an earlier call's copy, since %s at the latest)", mv.to, c.busySince.UTC().Format(time.RFC3339)))
			return nil, m.cfg.Poll, nil
		}
		err = fmt.Errorf("node %s still answers that the seed's copy runs, %s after it first did, longer than any copy runs: %w", mv.to, now.Sub(c.busySince).Round(time.Second), err)
	} else {
		c.busySince = time.Time{}
	}
	c.failures++
	if status.Code(err) == codes.AlreadyExists {
		err = fmt.Errorf("a volume named %s is on node %s already and is not a copy of this move's seed (an earlier move left it, and carve could not find it to delete it; the audit reports it as an orphan): %w", mv.target, mv.to, err)
	}
	return nil, 0, m.failed(ctx, mv, c.failures-1, "copying the seed to node "+mv.to, err)
}

func answered(ctx context.Context, done <-chan struct{}, wait time.Duration) bool {
	select {
	case <-done:
		return true
	default:
	}
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// refusedForGood names the catch-up refusal no retry mends, by ErrorInfo
// reason; "" for anything else (an open source or target is retried).
func refusedForGood(err error) string {
	if status.Code(err) != codes.FailedPrecondition {
		return ""
	}
	switch reason.Of(err) {
	case moveapi.ErrorSizeMismatch:
		return "the target is not of the source's size"
	case moveapi.ErrorBaseOverflowed:
		return "the seed ran out of its copy-on-write space, so it no longer holds what the target was copied from"
	case moveapi.ErrorSourceCopyPending:
		return "the source is itself still being copied into"
	case moveapi.ErrorNotFromBase:
		return "the target was not made from the seed, so it does not hold what the changes are counted from"
	}
	return ""
}

// sizesDiffer says why the catch-up would refuse the target for its size,
// "" when sizes match or a node does not report one. Larger extents or
// another stripe on the target node, or a claim grown during the seed copy,
// make them differ.
func (m *Mover) sizesDiffer(ctx context.Context, mv move) (string, error) {
	from, id := pinnedFrom(mv.pv, m.cfg.TopologyKey), mv.pv.Spec.CSI.VolumeHandle
	src, err := m.cfg.Volumes.ControllerGetVolumeOn(ctx, from, &csi.ControllerGetVolumeRequest{VolumeId: id})
	if err != nil {
		return "", fmt.Errorf("volume %s on node %s: %w", id, from, err)
	}
	target := mv.pv.Annotations[moveapi.AnnTargetID]
	dst, err := m.cfg.Volumes.ControllerGetVolumeOn(ctx, mv.to, &csi.ControllerGetVolumeRequest{VolumeId: target})
	if err != nil {
		return "", fmt.Errorf("the target %s on node %s: %w", target, mv.to, err)
	}
	a, b := src.GetVolume().GetCapacityBytes(), dst.GetVolume().GetCapacityBytes()
	if a == 0 || b == 0 || a == b {
		return "", nil
	}
	return fmt.Sprintf("the target %s on node %s has %d bytes, the volume %s on node %s has %d: the catch-up needs both of one size "+
		"(the nodes' volume groups differ in extent size or stripes, or the claim was resized while the seed was copied)", target, mv.to, b, id, from, a), nil
}
