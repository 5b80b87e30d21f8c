// A move's bookkeeping: names and IDs, phase annotations, Events, saved claim.

package mover

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/topology/pinned"
	"github.com/carve-csi/carve/internal/volume"
)

// targetID is the target's ID if the target node uses the old volume's VG
// name (nodes of one configuration do); "" when the old handle is not
// carve's or a PV of the target's name exists (in use, not a leftover).
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

func oldVG(pv *corev1.PersistentVolume) string {
	id, err := volume.ParseID(pv.Spec.CSI.VolumeHandle)
	if err != nil {
		return ""
	}
	return id.VG
}

func seedName(pv *corev1.PersistentVolume) string {
	if n := pv.Annotations[moveapi.AnnSeedName]; n != "" {
		return n
	}
	return SeedName(pv.Name, pv.Annotations[moveapi.AnnMoveTo], "")
}

// seedID is the ID of snapshot name of pv's volume (in its origin's VG);
// "" when unknown.
func (m *Mover) seedID(pv *corev1.PersistentVolume, name string) string {
	vg, node := oldVG(pv), pinnedFrom(pv, m.cfg.TopologyKey)
	if vg == "" || node == "" {
		return ""
	}
	return volume.SnapshotID(node, vg, volume.SnapshotLVNameFor(name))
}

// advance records the past phase's duration, writes extra annotations and
// the next phase, and an Event.
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

func (m *Mover) wait(ctx context.Context, mv move, what string) {
	klog.FromContext(ctx).V(2).Info("Move waiting", "for", what)
	if mv.pv.Annotations[moveapi.AnnWaiting] == what {
		return
	}
	if _, err := m.annotate(ctx, mv.pv, map[string]string{moveapi.AnnWaiting: what}); err != nil {
		klog.FromContext(ctx).V(2).Info("Could not record what the move waits for", "err", err.Error())
	}
}

// tell records an Event on the claim (by reference: it may be gone) and the
// old PV.
func (m *Mover) tell(mv move, typ, reason, msg string) {
	m.cfg.Events.Event(mv.claimRef(), typ, reason, msg)
	m.cfg.Events.Event(mv.pv, typ, reason, msg)
}

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

// Annotations a claim made again drops; the PV controller and provisioner
// write theirs anew.
var dropped = []string{moveapi.AnnMoveTo, "pv.kubernetes.io/bind-completed", "pv.kubernetes.io/bound-by-controller",
	"volume.kubernetes.io/selected-node", "volume.beta.kubernetes.io/storage-provisioner", "volume.kubernetes.io/storage-provisioner"}

// saveClaim keeps what makes the claim again; pod owner references are
// dropped, or the new claim would be collected with the old pod.
func saveClaim(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	out := &corev1.PersistentVolumeClaim{}
	out.Name, out.Namespace, out.UID = c.Name, c.Namespace, c.UID
	out.Labels = c.Labels
	for k, v := range c.Annotations {
		if !slices.Contains(dropped, k) {
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

// savedClaim is the claim saved on pv, without UID; nil when none is.
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

func bytesOf(pv *corev1.PersistentVolume) int64 {
	n, _ := strconv.ParseInt(pv.Annotations[moveapi.AnnBytes], 10, 64)
	return n
}

func claimToMakeAgain(pv *corev1.PersistentVolume, volumeName string) (*corev1.PersistentVolumeClaim, error) {
	c, err := savedClaim(pv)
	if err == nil && c == nil {
		err = fmt.Errorf("no annotation %s", moveapi.AnnClaim)
	}
	if err != nil {
		return nil, err
	}
	c.UID, c.ResourceVersion = "", ""
	c.Spec.VolumeName = volumeName
	return c, nil
}

func pinnedFrom(pv *corev1.PersistentVolume, key string) string { return pinned.Node(pv, key) }
