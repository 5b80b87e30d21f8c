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

// The seed's copy to the target node is one CreateVolume that lasts as
// long as the copy: hours for a large volume. It runs in a goroutine of
// its own, not in a worker: there are only `workers` of them, and a
// worker held by a seed for hours would leave a stopped workload's
// catch-up, binding or roll back waiting behind it. The worker starts
// the call and looks again at the move's poll, as any step that waits
// does; at most seedSlots copies run at once, as many as when each held
// a worker.
//
// A call that ends before the copy (the node channel's connection
// replaced on a certificate renewal, a leader change, the call's own
// deadline) leaves the copy running on the target node, detached from
// the call, under the volume's lock: every repeat answers ABORTED with
// the reason moveapi.ErrorCopyInProgress until it ends, and the first
// repeat after answers with the volume. Such an answer is progress, not
// a failure: it spends none of maxSeedRetries, and is waited for as long
// as a copy can run (copyBusyLimit), not a minute.

const (
	// seedSlots is how many seed copies run at once.
	seedSlots = workers
	// seedAnswerWait is how long the step that starts a seed's
	// CreateVolume waits for its answer: a volume made already, or a
	// refusal, is answered in the same step.
	seedAnswerWait = 2 * time.Second
	// copyBusyLimit is how long the target's node may answer that the
	// seed's copy still runs: a node stops its copy after copyTimeout
	// (started before the first such answer), and the hour covers the
	// copy's last sync and marking. Longer, the answer is a failure like
	// any other.
	copyBusyLimit = copyTimeout + time.Hour
)

// seedCopies are the seeds' copies of the moves in seeding, by old PV.
// A move is synced by one worker at a time (the work queue's promise),
// so each seedCopy is only touched by one worker and its call's
// goroutine, which publishes its answer by closing done.
type seedCopies struct {
	mu    sync.Mutex
	moves map[string]*seedCopy
	slots chan struct{}
}

func newSeedCopies() *seedCopies {
	return &seedCopies{moves: map[string]*seedCopy{}, slots: make(chan struct{}, seedSlots)}
}

// seedCopy is one move's copy of its seed: the call in flight, if any,
// and what the calls before it answered.
type seedCopy struct {
	// seed is the ID of the seed the target is restored from: a copy
	// of another seed (an earlier move of the PV) is not this move's.
	seed string
	call *seedCall
	// failures counts the calls that failed, against maxSeedRetries.
	failures int
	// busySince is when the target's node began answering that the copy
	// still runs; zero while it does not.
	busySince time.Time
}

// seedCall is one CreateVolume of a seed's target.
type seedCall struct {
	started time.Time
	done    chan struct{}
	resp    *csi.CreateVolumeResponse
	err     error
	cancel  context.CancelFunc
}

// of is the copy of pv's move from seed; one of another seed is dropped.
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

// drop forgets pv's copy, its call canceled: the move left seeding.
func (s *seedCopies) drop(pv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.moves[pv]; c != nil && c.call != nil {
		c.call.cancel()
	}
	delete(s.moves, pv)
}

// start runs create in a goroutine of its own, as c's call, when a slot
// is free; false when none is.
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

// copySeed makes the move's target volume from its seed (req): the
// answer once there is one, else how long to wait before looking again.
// An error is to retry with backoff (Mover.failed decided).
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

// answered tells whether done is closed, waiting at most wait for it.
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

// refusedForGood says what a FAILED_PRECONDITION refusal of the catch-up
// that no retry mends is about, by its ErrorInfo reason; "" for any
// other answer (a source or target still open is mended by the
// workload's stop, and retried).
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

// sizesDiffer tells, once the target is made, why the catch-up would
// refuse it for its size: "" when the volume and the target are of one
// size (or a node does not say its volume's size: the catch-up checks
// it then). A target node whose volume group has larger extents or
// another stripe makes the target larger, and a claim grown while the
// seed was copied makes the volume larger. Each node is asked about its
// own volume only.
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
