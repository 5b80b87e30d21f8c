package mover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/topology/pinned"
	"github.com/carve-csi/carve/internal/volume"
)

// abortRequested is moveapi.AnnAbort's value when `kubectl carve move --abort`
// set it; a failure sets "failed: <why>".
const (
	abortRequested = "requested"
	abortFailed    = "failed: "
)

// move is what a PV's annotations say of its move.
type move struct {
	pv         *corev1.PersistentVolume
	ns, name   string
	uid        types.UID
	to, target string
}

func (m *Mover) moveOf(pv *corev1.PersistentVolume) move {
	mv := move{pv: pv, to: pv.Annotations[moveapi.AnnMoveTo], target: pv.Annotations[moveapi.AnnTarget]}
	if r := pv.Spec.ClaimRef; r != nil {
		mv.ns, mv.name, mv.uid = r.Namespace, r.Name, r.UID
	}
	if c, err := savedClaim(pv); err == nil && c != nil {
		mv.ns, mv.name, mv.uid = c.Namespace, c.Name, c.UID
	}
	return mv
}

// claimRef is the claim of the move as an Event's object: the claim
// itself may be gone.
func (mv move) claimRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: mv.ns, Name: mv.name, UID: mv.uid}
}

// syncPV runs the next step of the PV's move. It returns how long to wait
// before looking again (a step that waits), or an error to retry with
// backoff.
func (m *Mover) syncPV(ctx context.Context, name string, attempt int) (time.Duration, error) {
	pv, err := m.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		m.parked.drop(name)
		m.seeds.drop(name)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	mv := m.moveOf(pv)
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("pv", name, "claim", mv.ns+"/"+mv.name, "to", mv.to))
	if pv.Annotations[moveapi.AnnPhase] != moveapi.PhaseParked {
		m.parked.drop(name)
	}
	if pv.Annotations[moveapi.AnnPhase] != moveapi.PhaseSeeding {
		m.seeds.drop(name)
	}
	switch pv.Annotations[moveapi.AnnPhase] {
	case "":
		return 0, nil
	case moveapi.PhaseSeeding:
		return m.seed(ctx, mv, attempt)
	case moveapi.PhaseStopping:
		return m.stop(ctx, mv, attempt)
	case moveapi.PhaseCatchingUp:
		return m.catchUp(ctx, mv, attempt)
	case moveapi.PhaseBinding:
		return m.bind(ctx, mv)
	case moveapi.PhaseCleaning:
		return m.clean(ctx, mv)
	case moveapi.PhaseRollingBack:
		return m.rollBack(ctx, mv, attempt)
	case moveapi.PhaseParked:
		return m.parkedStep(ctx, mv)
	}
	klog.FromContext(ctx).Info("Unknown move phase; leaving the PV alone", "phase", pv.Annotations[moveapi.AnnPhase])
	return 0, nil
}

// seed makes the seed snapshot and the target volume from it, unless the
// request was withdrawn; then saves the claim and stops the workload.
func (m *Mover) seed(ctx context.Context, mv move, attempt int) (time.Duration, error) {
	pv := mv.pv
	claim, err := m.cfg.Client.CoreV1().PersistentVolumeClaims(mv.ns).Get(ctx, mv.name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, err
	}
	switch {
	case pv.Annotations[moveapi.AnnAbort] != "":
		return 0, m.abort(ctx, mv, pv.Annotations[moveapi.AnnAbort])
	case claim == nil || apierrors.IsNotFound(err) || claim.UID != mv.uid || claim.DeletionTimestamp != nil:
		return 0, m.abort(ctx, mv, abortFailed+"the claim was deleted")
	case claim.Annotations[moveapi.AnnMoveTo] == "":
		return 0, m.abort(ctx, mv, abortRequested)
	}
	if pv.Annotations[moveapi.AnnSeed] == "" && pv.Annotations[moveapi.AnnSeedName] == "" {
		// Nothing of this move is made yet. The target's name is the same
		// for every move of the PV to the node: one an earlier move left
		// goes first, deleted on that node. Best effort after a few tries
		// (the node may be away): this move's own seed keeps a target
		// that stays from passing for its copy (CreateVolume answers
		// ALREADY_EXISTS).
		if err := m.deleteLeft(ctx, mv); err != nil {
			if retryable(err) && attempt < maxSeedRetries {
				m.wait(ctx, mv, "deleting what an earlier move to node "+mv.to+" left failed (retrying): "+err.Error())
				return 0, err
			}
			klog.FromContext(ctx).Info("Could not delete what an earlier move may have left; going on", "target", mv.target, "err", err.Error())
		}
		if pv, err = m.annotate(ctx, pv, map[string]string{moveapi.AnnSeedName: SeedName(pv.Name, mv.to, m.now().UTC().Format(time.RFC3339Nano))}); err != nil {
			return 0, err
		}
		mv.pv = pv
	}
	if pv.Annotations[moveapi.AnnSeed] == "" {
		resp, err := m.cfg.Volumes.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: seedName(pv), SourceVolumeId: pv.Spec.CSI.VolumeHandle})
		if err != nil {
			return 0, m.failed(ctx, mv, attempt, "making the seed snapshot", err)
		}
		if !resp.GetSnapshot().GetReadyToUse() {
			return m.cfg.Poll, nil
		}
		if pv, err = m.annotate(ctx, pv, map[string]string{moveapi.AnnSeed: resp.GetSnapshot().GetSnapshotId(),
			moveapi.AnnSeedTime: m.now().UTC().Format(time.RFC3339Nano)}); err != nil {
			return 0, err
		}
		mv.pv = pv
	}
	if pv.Annotations[moveapi.AnnTargetID] == "" {
		req, why, err := m.targetRequest(ctx, mv, pv.Annotations[moveapi.AnnSeed])
		if err != nil {
			return 0, err
		}
		if why != "" {
			return 0, m.abort(ctx, mv, abortFailed+why)
		}
		resp, after, err := m.copySeed(ctx, mv, req)
		if err != nil || resp == nil {
			// Copying, or given up (the move aborted or parked).
			return after, err
		}
		vc, _ := json.Marshal(resp.GetVolume().GetVolumeContext())
		if pv, err = m.annotate(ctx, pv, map[string]string{moveapi.AnnTargetID: resp.GetVolume().GetVolumeId(), moveapi.AnnTargetContext: string(vc)}); err != nil {
			return 0, err
		}
		mv.pv = pv
	}
	// The catch-up refuses a target of another size than the source;
	// known now, that ends the move before the workload stops.
	why, err := m.sizesDiffer(ctx, mv)
	if err != nil {
		return 0, m.failed(ctx, mv, attempt, "reading the sizes of the volume and its copy", err)
	}
	if why != "" {
		return 0, m.abort(ctx, mv, abortFailed+why)
	}
	saved, err := json.Marshal(saveClaim(claim))
	if err != nil {
		return 0, fmt.Errorf("saving claim %s/%s: %w", mv.ns, mv.name, err)
	}
	mv.pv = pv
	return 0, m.advance(ctx, mv, moveapi.PhaseStopping, map[string]string{moveapi.AnnClaim: string(saved)},
		fmt.Sprintf("the data is on node %s; stopping the workload: the claim is deleted and made again on the new volume", mv.to))
}

// stop deletes the claim (the pvc-protection finalizer keeps it while a
// pod uses it, and the scheduler starts no pod on a claim being deleted)
// and the pods that use it, and waits until it is gone.
func (m *Mover) stop(ctx context.Context, mv move, attempt int) (time.Duration, error) {
	if a := mv.pv.Annotations[moveapi.AnnAbort]; a != "" {
		return 0, m.startRollBack(ctx, mv, a)
	}
	claims := m.cfg.Client.CoreV1().PersistentVolumeClaims(mv.ns)
	claim, err := claims.Get(ctx, mv.name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, err
	}
	if err == nil && claim.UID == mv.uid {
		if claim.DeletionTimestamp == nil {
			err := claims.Delete(ctx, mv.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &mv.uid}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return 0, m.failed(ctx, mv, attempt, "deleting the claim", err)
			}
		}
		pods, err := m.cfg.Client.CoreV1().Pods(mv.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return 0, err
		}
		var stopped []string
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || !usesClaim(&p, mv.name) {
				continue
			}
			uid := p.UID
			err := m.cfg.Client.CoreV1().Pods(mv.ns).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return 0, m.failed(ctx, mv, attempt, "deleting pod "+p.Name, err)
			}
			stopped = append(stopped, p.Name)
		}
		if len(stopped) > 0 {
			m.tell(mv, corev1.EventTypeNormal, moveapi.ReasonMoving, "Stopping: deleted pod(s) "+strings.Join(stopped, ", ")+" that use the claim")
		}
		return m.cfg.Poll, nil
	}
	return 0, m.advance(ctx, mv, moveapi.PhaseCatchingUp, map[string]string{moveapi.AnnStopped: m.now().UTC().Format(time.RFC3339Nano)},
		"the claim is gone; sending what changed since the seed")
}

// usesClaim tells whether pod mounts claim.
func usesClaim(p *corev1.Pod, claim string) bool {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
			return true
		}
	}
	return false
}

// catchUp sends the changes since the seed to the target.
func (m *Mover) catchUp(ctx context.Context, mv move, attempt int) (time.Duration, error) {
	pv := mv.pv
	if a := pv.Annotations[moveapi.AnnAbort]; a != "" {
		return 0, m.startRollBack(ctx, mv, a)
	}
	cctx, cancel := context.WithTimeout(ctx, copyTimeout)
	began := m.now()
	n, err := m.cfg.CatchUp.CatchUpCopy(cctx, pv.Spec.CSI.VolumeHandle, pv.Annotations[moveapi.AnnSeed], mv.to, pv.Annotations[moveapi.AnnTargetID])
	took := m.now().Sub(began)
	cancel()
	if err != nil {
		if why := refusedForGood(err); why != "" {
			return 0, m.failed(ctx, mv, attempt, "sending what changed since the seed ("+why+"; no retry mends that)", err)
		}
		if status.Code(err) == codes.FailedPrecondition && attempt < m.cfg.Retries {
			m.wait(ctx, mv, "the source is still open on its node (its pod's volume not unstaged yet): "+err.Error())
			return 0, fmt.Errorf("catching up: %w", err)
		}
		return 0, m.failed(ctx, mv, attempt, "sending what changed since the seed", err)
	}
	err = m.advance(ctx, mv, moveapi.PhaseBinding, map[string]string{moveapi.AnnBytes: strconv.FormatInt(n, 10)},
		fmt.Sprintf("sent %d bytes that changed since the seed; binding the claim to the new volume", n))
	if err != nil {
		return 0, err
	}
	// Observed once the phase is written: a catch-up that runs again
	// because the write failed is still one move's.
	m.catchUpBytes.Observe(float64(n))
	m.catchUpSeconds.Observe(took.Seconds())
	return 0, nil
}

// bind makes the new PV, pre-bound to the claim, and the claim again on
// it (unless something made the claim already: the PV controller binds
// that one to the pre-bound PV too).
func (m *Mover) bind(ctx context.Context, mv move) (time.Duration, error) {
	pvs := m.cfg.Client.CoreV1().PersistentVolumes()
	np, err := pvs.Get(ctx, mv.target, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		np, err = pvs.Create(ctx, m.newPV(mv), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return m.cfg.Poll, nil
		}
	}
	if err != nil {
		return 0, fmt.Errorf("the new PV %s: %w", mv.target, err)
	}
	if np.Spec.CSI == nil || np.Spec.CSI.VolumeHandle != mv.pv.Annotations[moveapi.AnnTargetID] {
		m.wait(ctx, mv, fmt.Sprintf("a PV %s exists that is not this move's; delete it", mv.target))
		return m.cfg.Poll, nil
	}
	claims := m.cfg.Client.CoreV1().PersistentVolumeClaims(mv.ns)
	claim, err := claims.Get(ctx, mv.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c, err := savedClaim(mv.pv)
		if err != nil || c == nil {
			return 0, fmt.Errorf("the saved claim %s/%s on PV %s: %w", mv.ns, mv.name, mv.pv.Name, err)
		}
		c = fresh(c)
		c.Spec.VolumeName = mv.target
		if _, err := claims.Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("making claim %s/%s again: %w", mv.ns, mv.name, err)
		}
		return m.cfg.Poll, nil
	}
	if err != nil {
		return 0, err
	}
	switch {
	case claim.Spec.VolumeName == mv.target && claim.Status.Phase == corev1.ClaimBound:
		return 0, m.advance(ctx, mv, moveapi.PhaseCleaning, nil, fmt.Sprintf("the claim is bound to %s on node %s; deleting the old volume", mv.target, mv.to))
	case claim.Spec.VolumeName != "" && claim.Spec.VolumeName != mv.target:
		m.wait(ctx, mv, fmt.Sprintf("claim %s/%s is bound to %s, not to the moved volume %s", mv.ns, mv.name, claim.Spec.VolumeName, mv.target))
	}
	return m.cfg.Poll, nil
}

// newPV is the moved volume's PV: the old one's spec on the target
// volume and node, pre-bound to the claim by name.
func (m *Mover) newPV(mv move) *corev1.PersistentVolume {
	old := mv.pv
	pv := &corev1.PersistentVolume{}
	pv.Name = mv.target
	pv.Labels = old.Labels
	pv.Annotations = map[string]string{"pv.kubernetes.io/provisioned-by": m.cfg.Driver}
	for k, v := range old.Annotations {
		if strings.HasPrefix(k, "volume.kubernetes.io/provisioner-deletion-secret-") {
			pv.Annotations[k] = v
		}
	}
	pv.Spec = *old.Spec.DeepCopy()
	pv.Spec.CSI.VolumeHandle = old.Annotations[moveapi.AnnTargetID]
	var vc map[string]string
	if json.Unmarshal([]byte(old.Annotations[moveapi.AnnTargetContext]), &vc) == nil && vc != nil {
		for k, v := range old.Spec.CSI.VolumeAttributes {
			if _, ok := vc[k]; !ok && strings.HasPrefix(k, "storage.kubernetes.io/") {
				vc[k] = v
			}
		}
		pv.Spec.CSI.VolumeAttributes = vc
	}
	pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: m.cfg.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{mv.to}}}}}}}
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(old.Annotations[moveapi.AnnReclaimPolicy])
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: mv.ns, Name: mv.name}
	return pv
}

// clean deletes the seed, the old volume and the old PV.
func (m *Mover) clean(ctx context.Context, mv move) (time.Duration, error) {
	pv := mv.pv
	// The claim is bound to the target: the seed and the old volume go
	// only once the target answers for itself, there and whole.
	bad, err := m.vouch(ctx, mv.to, pv.Annotations[moveapi.AnnTargetID])
	if err != nil {
		return 0, err
	}
	if bad != "" {
		m.wait(ctx, mv, "keeping the old volume and the seed: "+bad)
		return max(m.cfg.Poll, parkedPoll), nil
	}
	salvaged := pv.Annotations[moveapi.AnnSalvage] != ""
	// A salvaged move's seed and old volume are on the node that was
	// lost: they are left there (the audit reports them should it come
	// back), only the old PV goes.
	if id := pv.Annotations[moveapi.AnnSeed]; id != "" && !salvaged {
		if _, err := m.cfg.Volumes.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
			return 0, fmt.Errorf("deleting the seed %s: %w", id, err)
		}
	}
	if !salvaged {
		if _, err := m.cfg.Volumes.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle}); err != nil {
			return 0, fmt.Errorf("deleting the old volume %s: %w", pv.Spec.CSI.VolumeHandle, err)
		}
	}
	durations := m.closePhase(pv, moveapi.PhaseCleaning)
	typ, reason, result := corev1.EventTypeNormal, moveapi.ReasonMoved, ResultMoved
	msg := fmt.Sprintf("Moved from node %s to node %s (PV %s, was %s); %d bytes sent after the workload stopped; phases: %s",
		pinnedFrom(pv, m.cfg.TopologyKey), mv.to, mv.target, pv.Name, bytesOf(pv), durations)
	if salvaged {
		typ, reason, result = corev1.EventTypeWarning, moveapi.ReasonSalvaged, ResultSalvaged
		msg = fmt.Sprintf("Salvaged onto node %s (PV %s, was %s on node %s): %s; the old volume and the seed stay on node %s",
			mv.to, mv.target, pv.Name, pinnedFrom(pv, m.cfg.TopologyKey), lostText(pv), pinnedFrom(pv, m.cfg.TopologyKey))
	}
	if c, err := m.cfg.Client.CoreV1().PersistentVolumeClaims(mv.ns).Get(ctx, mv.name, metav1.GetOptions{}); err == nil {
		m.cfg.Events.Event(c, typ, reason, msg)
	}
	klog.FromContext(ctx).Info("Moved", "newPV", mv.target, "phases", durations)
	// The old volume is gone: nothing is left for csi-provisioner to
	// delete, so its finalizer goes too.
	pv = pv.DeepCopy()
	fins := pv.Finalizers[:0]
	for _, f := range pv.Finalizers {
		if f != "external-provisioner.volume.kubernetes.io/finalizer" {
			fins = append(fins, f)
		}
	}
	if len(fins) != len(pv.Finalizers) {
		pv.Finalizers = fins
		if _, err := m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return 0, err
		}
	}
	uid := pv.UID
	err = m.cfg.Client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("deleting the old PV %s: %w", pv.Name, err)
	}
	m.moves.WithLabelValues(result).Inc()
	return 0, nil
}

// failed handles a step's failure: a retryable one (the code says so, or
// it is not a gRPC status) is retried Config.Retries times (maxSeedRetries
// while seeding); then, or at once
// for any other, the move gives up: an abort before stopping, a roll back
// from stopping or catching-up.
func (m *Mover) failed(ctx context.Context, mv move, attempt int, what string, err error) error {
	limit := m.cfg.Retries
	if mv.pv.Annotations[moveapi.AnnPhase] == moveapi.PhaseSeeding {
		limit = maxSeedRetries
	}
	if retryable(err) && attempt < limit {
		m.wait(ctx, mv, fmt.Sprintf("%s failed (retrying): %v", what, err))
		return fmt.Errorf("%s: %w", what, err)
	}
	why := abortFailed + what + ": " + err.Error()
	if mv.pv.Annotations[moveapi.AnnPhase] == moveapi.PhaseSeeding {
		return m.abort(ctx, mv, why)
	}
	return m.startRollBack(ctx, mv, why)
}

// retryable tells an error worth retrying: an API error, or a CSI code
// that says the call may succeed later.
func retryable(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return true
	}
	switch s.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled, codes.ResourceExhausted:
		return true
	}
	return false
}

// abort undoes a move before stopping: the target and the seed deleted,
// the old PV's reclaim policy back, the annotations and the request gone.
// why is moveapi.AnnAbort's value.
func (m *Mover) abort(ctx context.Context, mv move, why string) error {
	pv := mv.pv
	m.seeds.drop(pv.Name)
	if pv.Annotations[moveapi.AnnAbort] != why {
		var err error
		if pv, err = m.annotate(ctx, pv, map[string]string{moveapi.AnnAbort: why}); err != nil {
			return err
		}
	}
	if hasCopy(pv) {
		bad, err := m.vouchOld(ctx, pv)
		if err != nil {
			return err
		}
		if bad != "" {
			mv.pv = pv
			return m.park(ctx, mv, "aborting ("+strings.TrimPrefix(why, abortFailed)+"), but "+bad)
		}
	}
	if err := m.deleteTarget(ctx, pv); err != nil {
		return err
	}
	pv = pv.DeepCopy()
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(pv.Annotations[moveapi.AnnReclaimPolicy])
	for k := range pv.Annotations {
		if strings.HasPrefix(k, moveapi.AnnPrefix) {
			delete(pv.Annotations, k)
		}
	}
	if _, err := m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("restoring PV %s: %w", pv.Name, err)
	}
	result, reason, msg := ResultAborted, moveapi.ReasonAborted, "Move aborted as asked; the claim stays on its volume on node "+pinnedFrom(pv, m.cfg.TopologyKey)
	if w, ok := strings.CutPrefix(why, abortFailed); ok {
		result, reason, msg = ResultFailed, moveapi.ReasonMoveFailed, "Move to node "+mv.to+" failed, the claim stays on its volume on node "+pinnedFrom(pv, m.cfg.TopologyKey)+": "+w
	}
	klog.FromContext(ctx).Info("Move aborted", "result", result, "why", why)
	m.tell(mv, eventType(reason), reason, msg)
	m.moves.WithLabelValues(result).Inc()
	return m.dropRequest(ctx, mv.ns, mv.name, mv.uid)
}

func eventType(reason string) string {
	if reason == moveapi.ReasonMoveFailed || reason == moveapi.ReasonRolledBack {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

// deleteTarget deletes the move's target volume and seed, when they may
// have been made: by the IDs their answers gave, or, when an answer was
// lost (the call made them, the mover never learnt it), by the IDs their
// names give (targetID, seedID). A target is asked for only once the seed
// is known.
func (m *Mover) deleteTarget(ctx context.Context, pv *corev1.PersistentVolume) error {
	id := pv.Annotations[moveapi.AnnTargetID]
	if id == "" && pv.Annotations[moveapi.AnnSeed] != "" {
		var err error
		if id, err = m.targetID(ctx, pv); err != nil {
			return err
		}
	}
	if id != "" {
		node := pv.Annotations[moveapi.AnnMoveTo]
		if _, err := m.cfg.Volumes.DeleteVolumeOn(ctx, node, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			if status.Code(err) == codes.Unavailable {
				err = fmt.Errorf("%w: %w", errTargetAway, err)
			}
			return fmt.Errorf("deleting the target volume %s on node %s: %w", id, node, err)
		}
	}
	return m.deleteSeed(ctx, pv)
}

// errTargetAway: the target's node did not answer its deletion.
var errTargetAway = errors.New("the target's node is away")

// deleteSeed deletes the move's seed, by its ID or the one its name gives.
func (m *Mover) deleteSeed(ctx context.Context, pv *corev1.PersistentVolume) error {
	seed := pv.Annotations[moveapi.AnnSeed]
	if seed == "" && pv.Annotations[moveapi.AnnSeedName] != "" {
		seed = m.seedID(pv, seedName(pv))
	}
	if seed != "" {
		if _, err := m.cfg.Volumes.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: seed}); err != nil {
			return fmt.Errorf("deleting the seed %s: %w", seed, err)
		}
	}
	return nil
}

// deleteLeft deletes, before a move makes anything, the target volume and
// the seed of the names an earlier move of the PV to the same node may
// have left: a retried move must not find them (CreateVolume is
// idempotent by name: it would answer with the old target and its data).
func (m *Mover) deleteLeft(ctx context.Context, mv move) error {
	id, err := m.targetID(ctx, mv.pv)
	if err != nil {
		return err
	}
	if id != "" {
		if _, err := m.cfg.Volumes.DeleteVolumeOn(ctx, mv.to, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			return fmt.Errorf("deleting volume %s (%s) on node %s: %w", id, mv.target, mv.to, err)
		}
	}
	// The seed of a move begun before seeds had their own name.
	if seed := m.seedID(mv.pv, SeedName(mv.pv.Name, mv.to, "")); seed != "" {
		if _, err := m.cfg.Volumes.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: seed}); err != nil {
			return fmt.Errorf("deleting snapshot %s: %w", seed, err)
		}
	}
	return nil
}

// targetID is the ID the move's target volume has if the target node
// keeps it in the volume group of the same name as the old volume's (a
// volume ID is "<volume group>/<LV name>", the LV name derived from the
// CSI name, and nodes of one configuration name their groups alike);
// "" when the old handle is not carve's, or a PV of the target's name
// exists (a volume in use, not a leftover).
func (m *Mover) targetID(ctx context.Context, pv *corev1.PersistentVolume) (string, error) {
	target := pv.Annotations[moveapi.AnnTarget]
	vg := oldVG(pv)
	if vg == "" || target == "" {
		return "", nil
	}
	_, err := m.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, target, metav1.GetOptions{})
	switch {
	case err == nil:
		klog.FromContext(ctx).Info("A PV of the target's name exists; not deleting its volume", "target", target)
		return "", nil
	case !apierrors.IsNotFound(err):
		return "", fmt.Errorf("looking for PV %s: %w", target, err)
	}
	return volume.VolumeID(vg, volume.LVNameFor(target)), nil
}

// oldVG is the volume group of pv's volume; "" when its handle is not
// carve's.
func oldVG(pv *corev1.PersistentVolume) string {
	id, err := volume.ParseID(pv.Spec.CSI.VolumeHandle)
	if err != nil {
		return ""
	}
	return id.VG
}

// seedName is the CSI name of the move's seed.
func seedName(pv *corev1.PersistentVolume) string {
	if n := pv.Annotations[moveapi.AnnSeedName]; n != "" {
		return n
	}
	return SeedName(pv.Name, pv.Annotations[moveapi.AnnMoveTo], "")
}

// seedID is the ID of the snapshot name of pv's volume: a snapshot lives
// in its origin's volume group on its node; "" when that is not known.
func (m *Mover) seedID(pv *corev1.PersistentVolume, name string) string {
	vg, node := oldVG(pv), pinnedFrom(pv, m.cfg.TopologyKey)
	if vg == "" || node == "" {
		return ""
	}
	return volume.SnapshotID(node, vg, volume.SnapshotLVNameFor(name))
}

// startRollBack turns a move that stopped the workload back. A failure
// (not an abort asked for) is a MoveFailed Event naming it, once: the
// phase written, the failing step does not run again.
func (m *Mover) startRollBack(ctx context.Context, mv move, why string) error {
	reason, failed := strings.CutPrefix(why, abortFailed)
	if mv.pv.Annotations[moveapi.AnnPhase] == moveapi.PhaseCatchingUp {
		// The claim is gone and the target holds the data as of the seed.
		// With the source's node lost too, rolling back would bind the
		// claim to a volume nobody can read and then delete the target,
		// the only copy left; parked here, the move can still be salvaged.
		bad, err := m.vouchOld(ctx, mv.pv)
		if err != nil {
			return err
		}
		if bad != "" {
			if !failed {
				reason = "asked to abort"
			}
			return m.park(ctx, mv, reason+", but "+bad)
		}
	}
	klog.FromContext(ctx).Info("Rolling the move back", "why", why)
	extra := map[string]string{moveapi.AnnAbort: why}
	if err := m.advance(ctx, mv, moveapi.PhaseRollingBack, extra, "rolling back ("+reason+"): the claim is made again on its old volume"); err != nil {
		return err
	}
	if failed {
		m.tell(mv, corev1.EventTypeWarning, moveapi.ReasonMoveFailed, "Move to node "+mv.to+" failed after the workload stopped, rolling back to the old volume "+
			mv.pv.Name+" on node "+pinnedFrom(mv.pv, m.cfg.TopologyKey)+": "+reason)
	}
	return nil
}

// rollBack pre-binds the old PV to the claim and makes the claim again on
// it once the old one is gone; when it is bound, the target and the seed
// go and the move ends. A target whose node stays away (UNAVAILABLE
// after maxSeedRetries) is left there: the claim is back on its old
// volume, and the next move to that node deletes it first (deleteLeft).
func (m *Mover) rollBack(ctx context.Context, mv move, attempt int) (time.Duration, error) {
	pv := mv.pv
	claims := m.cfg.Client.CoreV1().PersistentVolumeClaims(mv.ns)
	claim, err := claims.Get(ctx, mv.name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, err
	}
	if err == nil && claim.UID == mv.uid && claim.DeletionTimestamp != nil {
		// The old claim is still being deleted (its pods stopping).
		return m.cfg.Poll, nil
	}
	// Pre-bound by name, or bound already to the claim made again (the
	// PV controller writes its UID), or still to the old claim (an abort
	// asked before stopping deleted it): taking that UID away would
	// leave the bound claim Lost.
	var again types.UID
	if err == nil {
		again = claim.UID
	}
	r := pv.Spec.ClaimRef
	refOK := r != nil && (r.UID == "" || r.UID == again) && r.Namespace == mv.ns && r.Name == mv.name
	if !refOK || string(pv.Spec.PersistentVolumeReclaimPolicy) != pv.Annotations[moveapi.AnnReclaimPolicy] {
		pv = pv.DeepCopy()
		if !refOK {
			pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: mv.ns, Name: mv.name}
		}
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimPolicy(pv.Annotations[moveapi.AnnReclaimPolicy])
		if pv, err = m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
			return 0, fmt.Errorf("pre-binding PV %s to claim %s/%s again: %w", mv.pv.Name, mv.ns, mv.name, err)
		}
		mv.pv = pv
	}
	if apierrors.IsNotFound(err) {
		c, err := savedClaim(pv)
		if err != nil || c == nil {
			return 0, fmt.Errorf("the saved claim %s/%s on PV %s: %w", mv.ns, mv.name, pv.Name, err)
		}
		c = fresh(c)
		c.Spec.VolumeName = pv.Name
		if _, err := claims.Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("making claim %s/%s again: %w", mv.ns, mv.name, err)
		}
		return m.cfg.Poll, nil
	}
	if claim.Spec.VolumeName != pv.Name || claim.Status.Phase != corev1.ClaimBound {
		if claim.Spec.VolumeName != "" && claim.Spec.VolumeName != pv.Name {
			m.wait(ctx, mv, fmt.Sprintf("claim %s/%s is bound to %s, not to its old volume %s", mv.ns, mv.name, claim.Spec.VolumeName, pv.Name))
		}
		return m.cfg.Poll, nil
	}
	// Bound again: the target and the seed go only if the old volume is
	// there to hold the data.
	bad, err := m.vouchOld(ctx, pv)
	if err != nil {
		return 0, err
	}
	if bad != "" {
		return 0, m.park(ctx, mv, "rolling back to the old volume, but "+bad)
	}
	if err := m.deleteTarget(ctx, pv); err != nil {
		if !errors.Is(err, errTargetAway) || attempt < maxSeedRetries {
			m.wait(ctx, mv, "rolling back: "+err.Error())
			return 0, err
		}
		klog.FromContext(ctx).Info("Leaving the target on its node, which is away; the next move there deletes it", "err", err.Error())
		m.tell(mv, corev1.EventTypeWarning, moveapi.ReasonRolledBack, fmt.Sprintf("Left the target volume %s on node %s, which does not answer: the next move to that node deletes it, and carve controller's audit reports it until then (%v)",
			pv.Annotations[moveapi.AnnTargetID], mv.to, err))
		if err := m.deleteSeed(ctx, pv); err != nil {
			return 0, err
		}
	}
	why := strings.TrimPrefix(pv.Annotations[moveapi.AnnAbort], abortFailed)
	pv = pv.DeepCopy()
	for k := range pv.Annotations {
		if strings.HasPrefix(k, moveapi.AnnPrefix) {
			delete(pv.Annotations, k)
		}
	}
	if _, err := m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return 0, fmt.Errorf("clearing the move from PV %s: %w", pv.Name, err)
	}
	msg := fmt.Sprintf("Move to node %s rolled back (%s); the claim is bound to its old volume %s on node %s again", mv.to, why, pv.Name, pinnedFrom(pv, m.cfg.TopologyKey))
	m.cfg.Events.Event(claim, corev1.EventTypeWarning, moveapi.ReasonRolledBack, msg)
	m.cfg.Events.Event(pv, corev1.EventTypeWarning, moveapi.ReasonRolledBack, msg)
	m.moves.WithLabelValues(ResultRolledBack).Inc()
	klog.FromContext(ctx).Info("Move rolled back", "why", why)
	// A claim never deleted still asks; one made again does not.
	return 0, m.dropRequest(ctx, mv.ns, mv.name, claim.UID)
}

// advance moves to the next phase: the past one's duration recorded,
// extra annotations written, an Event.
func (m *Mover) advance(ctx context.Context, mv move, next string, extra map[string]string, what string) error {
	pv := mv.pv
	durations := m.closePhase(pv, pv.Annotations[moveapi.AnnPhase])
	set := map[string]string{moveapi.AnnPhase: next, moveapi.AnnPhaseSince: m.now().UTC().Format(time.RFC3339Nano), moveapi.AnnDurations: durations, moveapi.AnnWaiting: ""}
	for k, v := range extra {
		set[k] = v
	}
	pv, err := m.annotate(ctx, pv, set)
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Move phase", "phase", next)
	mv.pv = pv
	m.tell(mv, corev1.EventTypeNormal, moveapi.ReasonMoving, next+": "+what)
	m.queue.Add(pvKey + pv.Name)
	return nil
}

// closePhase observes the current phase's duration and returns the
// durations so far with it.
func (m *Mover) closePhase(pv *corev1.PersistentVolume, phase string) string {
	d := pv.Annotations[moveapi.AnnDurations]
	since, err := time.Parse(time.RFC3339Nano, pv.Annotations[moveapi.AnnPhaseSince])
	if err != nil || phase == "" || phase == moveapi.PhaseRollingBack {
		return d
	}
	took := m.now().Sub(since)
	m.phases.WithLabelValues(phase).Observe(took.Seconds())
	if d != "" {
		d += ","
	}
	return d + phase + "=" + took.Round(time.Millisecond).String()
}

// wait records what the move waits for (moveapi.AnnWaiting), for kubectl, and
// logs it; best effort.
func (m *Mover) wait(ctx context.Context, mv move, what string) {
	klog.FromContext(ctx).V(2).Info("Move waiting", "for", what)
	if mv.pv.Annotations[moveapi.AnnWaiting] == what {
		return
	}
	if _, err := m.annotate(ctx, mv.pv, map[string]string{moveapi.AnnWaiting: what}); err != nil {
		klog.FromContext(ctx).V(2).Info("Could not record what the move waits for", "err", err.Error())
	}
}

// tell records an Event on the claim (by reference: it may be gone) and
// on the old PV.
func (m *Mover) tell(mv move, typ, reason, msg string) {
	m.cfg.Events.Event(mv.claimRef(), typ, reason, msg)
	m.cfg.Events.Event(mv.pv, typ, reason, msg)
}

// annotate sets (or, for "", removes) annotations on pv and returns it
// updated.
func (m *Mover) annotate(ctx context.Context, pv *corev1.PersistentVolume, set map[string]string) (*corev1.PersistentVolume, error) {
	pv = pv.DeepCopy()
	if pv.Annotations == nil {
		pv.Annotations = map[string]string{}
	}
	for k, v := range set {
		if v == "" {
			delete(pv.Annotations, k)
		} else {
			pv.Annotations[k] = v
		}
	}
	out, err := m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("recording the move on PV %s: %w", pv.Name, err)
	}
	return out, nil
}

// Annotations a claim made again does not keep: the request, the
// binding's (the PV controller writes them anew), the provisioner's and
// the old node's.
var dropped = []string{moveapi.AnnMoveTo, "pv.kubernetes.io/bind-completed", "pv.kubernetes.io/bound-by-controller",
	"volume.kubernetes.io/selected-node", "volume.beta.kubernetes.io/storage-provisioner", "volume.kubernetes.io/storage-provisioner"}

// saveClaim is what is kept of the claim to make it again: name, labels,
// annotations, owners that are not pods (a pod's owner reference would
// have the new claim collected with the old pod), and its spec.
func saveClaim(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	out := &corev1.PersistentVolumeClaim{}
	out.Name, out.Namespace, out.UID = c.Name, c.Namespace, c.UID
	out.Labels = c.Labels
	for k, v := range c.Annotations {
		if !contains(dropped, k) {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	for _, r := range c.OwnerReferences {
		if r.Kind != "Pod" {
			out.OwnerReferences = append(out.OwnerReferences, r)
		}
	}
	out.Spec = *c.Spec.DeepCopy()
	out.Spec.VolumeName = ""
	return out
}

// savedClaim is the claim saved on pv, ready to create (no UID); nil when
// none is saved.
func savedClaim(pv *corev1.PersistentVolume) (*corev1.PersistentVolumeClaim, error) {
	s := pv.Annotations[moveapi.AnnClaim]
	if s == "" {
		return nil, nil
	}
	var c corev1.PersistentVolumeClaim
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", moveapi.AnnClaim, err)
	}
	return &c, nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func bytesOf(pv *corev1.PersistentVolume) int64 {
	n, _ := strconv.ParseInt(pv.Annotations[moveapi.AnnBytes], 10, 64)
	return n
}

// fresh is a saved claim ready to create: no UID.
func fresh(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	c = c.DeepCopy()
	c.UID, c.ResourceVersion = "", ""
	return c
}

func pinnedFrom(pv *corev1.PersistentVolume, key string) string { return pinned.Node(pv, key) }
