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

// A move deletes its target or its seed only when the claim is (or goes
// back) on a volume that is there, whole and on a node that answers: the
// old volume when it rolls back or aborts, the target when it cleans.
// When the old volume cannot be vouched for, the target may hold the only
// copy of the data (as of the seed, or all of it when a catch-up finished
// but its answer was lost), so the move parks instead: nothing is
// deleted, an Event and carve_moves_parked say so, and the move resumes
// where it was once the old volume answers again.

// parkedPoll is how often a parked move asks after its old volume.
const parkedPoll = 30 * time.Second

// vouch tells whether the volume id is on node, whole, by asking that
// node alone: "" when it is, else why not (a node that does not answer
// cannot vouch for anything). An error is the mover's own context ending.
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

// vouchOld is vouch for the move's old volume, on the node its PV pins.
func (m *Mover) vouchOld(ctx context.Context, pv *corev1.PersistentVolume) (string, error) {
	return m.vouch(ctx, pinnedFrom(pv, m.cfg.TopologyKey), pv.Spec.CSI.VolumeHandle)
}

// hasCopy tells whether the move may have made a target or a seed.
func hasCopy(pv *corev1.PersistentVolume) bool {
	a := pv.Annotations
	return a[moveapi.AnnTargetID] != "" || a[moveapi.AnnSeed] != "" || a[moveapi.AnnSeedName] != ""
}

// park stops the move where it is, keeping what it made; why names what
// could not be vouched for. An abort the user asked for stays asked (the
// parked move then releases the claim's name and rolls back once the old
// volume answers); a failure is dropped, so that the move resumes where
// it parked.
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

// parkedStep looks after a parked move: once the old volume answers, it
// resumes where it parked (asked to abort meanwhile: it rolls back);
// until then it keeps everything.
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

// parkedMoves are the old PVs whose move is parked, counted by
// carve_moves_parked; each PV once however often its move is seen.
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

// salvage binds the claim of a move parked while catching up to its
// target as it is, the data as of the seed (moveapi.AnnSalvage asks it):
// the move goes on to binding, and its cleaning leaves what is on the
// lost node. The target must answer for itself first. A move parked in
// another phase is not salvaged: its claim may be bound to the old
// volume again, or its target never made.
func (m *Mover) salvage(ctx context.Context, mv move) (time.Duration, error) {
	pv := mv.pv
	if from := pv.Annotations[moveapi.AnnParkedFrom]; from != moveapi.PhaseCatchingUp {
		m.wait(ctx, mv, "parked in "+from+": only a move parked while catching up can be salvaged")
		return max(m.cfg.Poll, parkedPoll), nil
	}
	bad, err := m.vouch(ctx, mv.to, pv.Annotations[moveapi.AnnTargetID])
	if err != nil {
		return 0, err
	}
	if bad != "" {
		m.wait(ctx, mv, "salvaging: "+bad)
		return max(m.cfg.Poll, parkedPoll), nil
	}
	lost := moveapi.WritesLostText(pv.Annotations)
	klog.FromContext(ctx).Info("Salvaging the parked move: binding the claim to its target as of the seed", "lost", lost)
	err = m.advance(ctx, mv, moveapi.PhaseBinding, map[string]string{moveapi.AnnParked: "", moveapi.AnnParkedFrom: ""},
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
