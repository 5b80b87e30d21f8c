package mover

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
)

// A move deletes its target or seed only when the claim is on a volume that
// is there, whole, on a node that answers. When the old volume cannot be
// vouched for, the target may hold the only copy, so the move parks:
// nothing is deleted, and it resumes once the old volume answers.

const parkedPoll = 30 * time.Second

// vouch asks node alone whether volume id is there and whole: "" when it
// is, else why not. An error is the mover's own context ending.
func (m *Mover) vouch(ctx context.Context, node, id string) (string, error) {
	if node == "" {
		return fmt.Sprintf("the node of volume %s is not known", id), nil
	}
	_, err := m.cfg.Volumes.ControllerGetVolumeOn(ctx, node, &csi.ControllerGetVolumeRequest{VolumeId: id})
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	switch status.Code(err) {
	case codes.OK:
		return "", nil
	case codes.NotFound:
		return fmt.Sprintf("volume %s is not on node %s: %v", id, node, err), nil
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Sprintf("node %s does not answer, so whether volume %s is there is not known: %v", node, id, err), nil
	}
	return fmt.Sprintf("node %s does not vouch for volume %s: %v", node, id, err), nil
}

func (m *Mover) vouchOld(ctx context.Context, pv *corev1.PersistentVolume) (string, error) {
	return m.vouch(ctx, pinnedFrom(pv, m.cfg.TopologyKey), pv.Spec.CSI.VolumeHandle)
}

func hasCopy(pv *corev1.PersistentVolume) bool {
	a := pv.Annotations
	return a[moveapi.AnnTargetID] != "" || a[moveapi.AnnSeed] != "" || a[moveapi.AnnSeedName] != ""
}

// park stops the move, keeping what it made. A user's abort stays asked (it
// rolls back once the old volume answers); a failure is dropped so the move
// resumes where it parked.
func (m *Mover) park(ctx context.Context, mv move, why string) error {
	from := mv.pv.Annotations[moveapi.AnnPhase]
	abort := ""
	if mv.pv.Annotations[moveapi.AnnAbort] == abortRequested {
		abort = abortRequested
	}
	klog.FromContext(ctx).Info("Parking the move: its target and seed are kept", "from", from, "why", why)
	err := m.advance(ctx, mv, moveapi.PhaseParked, map[string]string{moveapi.AnnParked: why, moveapi.AnnParkedFrom: from, moveapi.AnnAbort: abort},
		"the target and the seed are kept: "+why)
	if err != nil {
		return err
	}
	m.parked.add(mv.pv.Name)
	next := "the move resumes once the old volume " + mv.pv.Name + " answers again, or see `kubectl carve move --abort`"
	if abort != "" {
		next = "the move rolls back once the old volume " + mv.pv.Name + " answers again"
	}
	if from == moveapi.PhaseCatchingUp {
		next += "; `kubectl carve move --salvage` binds the claim to the target as of the seed"
	}
	m.tell(mv, corev1.EventTypeWarning, moveapi.ReasonParked, fmt.Sprintf(
		"Move to node %s parked in %s: %s. The target %s on node %s and the seed are kept; %s",
		mv.to, from, why, mv.pv.Annotations[moveapi.AnnTargetID], mv.to, next))
	return nil
}

func (m *Mover) parkedStep(ctx context.Context, mv move) (time.Duration, error) {
	pv := mv.pv
	m.parked.add(pv.Name)
	if pv.Annotations[moveapi.AnnSalvage] != "" {
		return m.salvage(ctx, mv)
	}
	why, err := m.vouchOld(ctx, pv)
	if err != nil {
		return 0, err
	}
	if why != "" {
		m.wait(ctx, mv, "parked: "+why)
		return max(m.cfg.Poll, parkedPoll), nil
	}
	next := pv.Annotations[moveapi.AnnParkedFrom]
	extra := map[string]string{moveapi.AnnParked: "", moveapi.AnnParkedFrom: ""}
	if a := pv.Annotations[moveapi.AnnAbort]; a != "" && next != moveapi.PhaseSeeding {
		next = moveapi.PhaseRollingBack
	}
	if next == "" {
		next = moveapi.PhaseRollingBack
	}
	if err := m.advance(ctx, mv, next, extra, "the old volume answers again; resuming"); err != nil {
		return 0, err
	}
	m.parked.drop(pv.Name)
	return 0, nil
}

// parkedMoves are the parked old PVs, each counted once in
// carve_moves_parked.
type parkedMoves struct {
	mu    sync.Mutex
	pvs   map[string]bool
	gauge prometheus.Gauge
}

func (p *parkedMoves) add(pv string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pvs[pv] = true
	p.gauge.Set(float64(len(p.pvs)))
}

func (p *parkedMoves) drop(pv string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pvs, pv)
	p.gauge.Set(float64(len(p.pvs)))
}

func (p *parkedMoves) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.pvs)
	p.gauge.Set(0)
}

// awaitTarget has the move wait, saying doing, until its target vouches
// for itself: while it does not, the answer is when to look again; once
// it does, 0.
func (m *Mover) awaitTarget(ctx context.Context, mv move, doing string) (time.Duration, error) {
	bad, err := m.vouch(ctx, mv.to, mv.pv.Annotations[moveapi.AnnTargetID])
	if err != nil || bad == "" {
		return 0, err
	}
	m.wait(ctx, mv, doing+": "+bad)
	return max(m.cfg.Poll, parkedPoll), nil
}

// salvage binds a move parked while catching up to its target as of the seed
// (moveapi.AnnSalvage) once the target vouches for itself.
func (m *Mover) salvage(ctx context.Context, mv move) (time.Duration, error) {
	pv := mv.pv
	if from := pv.Annotations[moveapi.AnnParkedFrom]; from != moveapi.PhaseCatchingUp {
		m.wait(ctx, mv, "parked in "+from+": only a move parked while catching up can be salvaged")
		return max(m.cfg.Poll, parkedPoll), nil
	}
	if retry, err := m.awaitTarget(ctx, mv, "salvaging"); err != nil || retry > 0 {
		return retry, err
	}
	lost := moveapi.WritesLostText(pv.Annotations)
	klog.FromContext(ctx).Info("Salvaging the parked move: binding the claim to its target as of the seed", "lost", lost)
	err := m.advance(ctx, mv, moveapi.PhaseBinding, map[string]string{moveapi.AnnParked: "", moveapi.AnnParkedFrom: ""},
		"salvaging as asked: binding the claim to the target as of the seed")
	if err != nil {
		return 0, err
	}
	m.parked.drop(pv.Name)
	m.tell(mv, corev1.EventTypeWarning, moveapi.ReasonSalvaged, fmt.Sprintf(
		"Salvaging as asked: claim %s/%s is bound to the target %s on node %s, which holds the data as of the seed: %s",
		mv.ns, mv.name, pv.Annotations[moveapi.AnnTargetID], mv.to, lost))
	return 0, nil
}
