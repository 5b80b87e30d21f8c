package mover

import (
	"context"
	"encoding/json"
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
)

// abortRequested is moveapi.AnnAbort's value when the user aborts; a failure
// sets "failed: <why>".
const (
	abortRequested = "requested"
	abortFailed    = "failed: "
)

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

// claimRef is the claim as an Event's object: the claim itself may be gone.
func (mv move) claimRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: mv.ns, Name: mv.name, UID: mv.uid}
}

// syncPV runs the next step of the PV's move: how long to wait, or an error
// to retry with backoff.
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

// seed makes the seed and the target from it, then saves the claim and
// stops the workload, unless the request was withdrawn.
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
		// The target's name is the same for every move of the PV to the node, so
		// one an earlier move left goes first. Best effort: this move's own seed
		// keeps a stale target from passing for its copy (ALREADY_EXISTS).
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
			return after, err
		}
		vc, _ := json.Marshal(resp.GetVolume().GetVolumeContext())
		if pv, err = m.annotate(ctx, pv, map[string]string{moveapi.AnnTargetID: resp.GetVolume().GetVolumeId(), moveapi.AnnTargetContext: string(vc)}); err != nil {
			return 0, err
		}
		mv.pv = pv
	}
	// Sizes known now end the move before the workload stops.
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

// stop deletes the claim (the scheduler starts no pod on a claim being
// deleted) and its pods, and waits until it is gone.
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

func usesClaim(p *corev1.Pod, claim string) bool {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
			return true
		}
	}
	return false
}

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
	// Observed after the phase is written, so a rerun counts once.
	m.catchUpBytes.Observe(float64(n))
	m.catchUpSeconds.Observe(took.Seconds())
	return 0, nil
}

// bind makes the new PV pre-bound to the claim, and the claim again unless
// something made it already (the PV controller binds that one too).
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
		c, err := claimToMakeAgain(mv.pv, mv.target)
		if err != nil {
			return 0, fmt.Errorf("the saved claim %s/%s on PV %s: %w", mv.ns, mv.name, mv.pv.Name, err)
		}
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

// newPV is the old PV's spec on the target volume and node, pre-bound to
// the claim by name.
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

func (m *Mover) clean(ctx context.Context, mv move) (time.Duration, error) {
	pv := mv.pv
	// The seed and old volume go only once the target vouches for itself.
	if retry, err := m.awaitTarget(ctx, mv, "keeping the old volume and the seed"); err != nil || retry > 0 {
		return retry, err
	}
	salvaged := pv.Annotations[moveapi.AnnSalvage] != ""
	// A salvaged move leaves its seed and old volume on the lost node (the
	// audit reports them should it return); only the old PV goes.
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
			mv.to, mv.target, pv.Name, pinnedFrom(pv, m.cfg.TopologyKey), moveapi.WritesLostText(pv.Annotations), pinnedFrom(pv, m.cfg.TopologyKey))
	}
	if c, err := m.cfg.Client.CoreV1().PersistentVolumeClaims(mv.ns).Get(ctx, mv.name, metav1.GetOptions{}); err == nil {
		m.cfg.Events.Event(c, typ, reason, msg)
	}
	klog.FromContext(ctx).Info("Moved", "newPV", mv.target, "phases", durations)
	// Nothing is left for csi-provisioner to delete, so its finalizer goes.
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
	err := m.cfg.Client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("deleting the old PV %s: %w", pv.Name, err)
	}
	m.moves.WithLabelValues(result).Inc()
	return 0, nil
}
