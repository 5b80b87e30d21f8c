package mover

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/controller/podfit"
	"github.com/carve-csi/carve/internal/topology/pinned"
)

// syncClaim starts the move a claim asks for, or refuses it (an Event, and
// the annotation removed so it is not asked again).
func (m *Mover) syncClaim(ctx context.Context, key string) (time.Duration, error) {
	ns, name, _ := strings.Cut(key, "/")
	c, err := m.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	to := c.Annotations[moveapi.AnnMoveTo]
	if to == "" && c.Spec.VolumeName != "" {
		// Withdrawn: the PV's move, if it runs, aborts.
		m.queue.Add(pvKey + c.Spec.VolumeName)
		return 0, nil
	}
	if to == "" || c.DeletionTimestamp != nil {
		return 0, nil
	}
	if c.Status.Phase != corev1.ClaimBound || c.Spec.VolumeName == "" {
		return 0, m.refuse(ctx, c, "the claim is not bound to a volume yet")
	}
	pv, err := m.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, m.refuse(ctx, c, fmt.Sprintf("its PersistentVolume %s does not exist", c.Spec.VolumeName))
	}
	if err != nil {
		return 0, err
	}
	if pv.Annotations[moveapi.AnnPhase] != "" {
		m.queue.Add(pvKey + pv.Name)
		return 0, nil
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != m.cfg.Driver {
		return 0, m.refuse(ctx, c, fmt.Sprintf("its PersistentVolume %s is not a carve volume", pv.Name))
	}
	if r := pv.Spec.ClaimRef; r == nil || r.UID != c.UID {
		return 0, m.refuse(ctx, c, fmt.Sprintf("its PersistentVolume %s is not bound to it", pv.Name))
	}
	from := pinned.Node(pv, m.cfg.TopologyKey)
	if from == "" {
		return 0, m.refuse(ctx, c, fmt.Sprintf("its PersistentVolume %s names no node under %s", pv.Name, m.cfg.TopologyKey))
	}
	node, why, err := m.targetNode(ctx, c, pv, from, to)
	if err != nil {
		return 0, err
	}
	if why != "" {
		return 0, m.refuse(ctx, c, why)
	}
	policy := pv.Spec.PersistentVolumeReclaimPolicy
	if policy == "" {
		policy = corev1.PersistentVolumeReclaimDelete
	}
	pv = pv.DeepCopy()
	if pv.Annotations == nil {
		pv.Annotations = map[string]string{}
	}
	for k, v := range map[string]string{moveapi.AnnMoveTo: node, moveapi.AnnPhase: moveapi.PhaseSeeding, moveapi.AnnReclaimPolicy: string(policy),
		moveapi.AnnTarget: TargetName(pv.Name, node), moveapi.AnnPhaseSince: m.now().UTC().Format(time.RFC3339Nano)} {
		pv.Annotations[k] = v
	}
	// Retain first: the claim is deleted on the way.
	pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	if _, err := m.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return 0, fmt.Errorf("starting the move of %s/%s: %w", ns, name, err)
	}
	msg := fmt.Sprintf("Moving from node %s to node %s: seeding (a snapshot, copied to %s while the workload runs)", from, node, node)
	klog.FromContext(ctx).Info("Move started", "claim", key, "pv", pv.Name, "from", from, "to", node)
	m.cfg.Events.Event(c, corev1.EventTypeNormal, moveapi.ReasonMoving, msg)
	m.cfg.Events.Event(pv, corev1.EventTypeNormal, moveapi.ReasonMoving, msg)
	m.queue.Add(pvKey + pv.Name)
	return 0, nil
}

func (m *Mover) refuse(ctx context.Context, c *corev1.PersistentVolumeClaim, why string) error {
	klog.FromContext(ctx).Info("Move refused", "claim", c.Namespace+"/"+c.Name, "why", why)
	m.cfg.Events.Event(c, corev1.EventTypeWarning, moveapi.ReasonMoveFailed, "Not moved: "+why)
	m.moves.WithLabelValues(ResultRefused).Inc()
	return m.dropRequest(ctx, c.Namespace, c.Name, c.UID)
}

// dropRequest removes moveapi.AnnMoveTo from the claim (of uid, when set).
func (m *Mover) dropRequest(ctx context.Context, ns, name string, uid types.UID) error {
	c, err := m.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, ok := c.Annotations[moveapi.AnnMoveTo]; !ok || uid != "" && c.UID != uid {
		return nil
	}
	c = c.DeepCopy()
	delete(c.Annotations, moveapi.AnnMoveTo)
	if _, err := m.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Update(ctx, c, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("taking %s off claim %s/%s: %w", moveapi.AnnMoveTo, ns, name, err)
	}
	return nil
}

// targetNode resolves the request to a node, or why it cannot go there. The
// node needs a CSIStorageCapacity of the PV's class with room, and every
// pod of the claim must fit it (podfit.Why), or the stopped workload would
// not start again; * takes the fitting node with the most room.
func (m *Mover) targetNode(ctx context.Context, c *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, from, to string) (node, why string, err error) {
	if to == from {
		return "", fmt.Sprintf("it is on node %s already", from), nil
	}
	class := pv.Spec.StorageClassName
	if class == "" {
		return "", fmt.Sprintf("its PersistentVolume %s has no StorageClass", pv.Name), nil
	}
	caps, err := m.cfg.Client.StorageV1().CSIStorageCapacities(m.cfg.CapacityNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", "", fmt.Errorf("listing CSIStorageCapacity objects: %w", err)
	}
	size := pv.Spec.Capacity[corev1.ResourceStorage]
	type candidate struct {
		node string
		room int64
	}
	var roomy []candidate
	seen := false
	for _, c := range caps.Items {
		if c.StorageClassName != class || c.NodeTopology == nil {
			continue
		}
		n := c.NodeTopology.MatchLabels[m.cfg.TopologyKey]
		if n == "" || n == from || to != moveapi.AnyNode && n != to {
			continue
		}
		seen = true
		room := c.Capacity
		if c.MaximumVolumeSize != nil {
			room = c.MaximumVolumeSize
		}
		if room == nil || room.Cmp(size) < 0 {
			continue
		}
		roomy = append(roomy, candidate{n, room.Value()})
	}
	switch {
	case len(roomy) == 0 && to == moveapi.AnyNode && !seen:
		return "", fmt.Sprintf("no other node reports capacity for StorageClass %s", class), nil
	case len(roomy) == 0 && to == moveapi.AnyNode:
		return "", fmt.Sprintf("no other node has room for %s in StorageClass %s", size.String(), class), nil
	case len(roomy) == 0 && !seen:
		return "", fmt.Sprintf("node %s reports no capacity for StorageClass %s (no connected carve node agent there, or the class's device class has no volume group on it)", to, class), nil
	case len(roomy) == 0:
		return "", fmt.Sprintf("node %s has no room for %s in StorageClass %s", to, size.String(), class), nil
	}
	slices.SortFunc(roomy, func(a, b candidate) int {
		if a.room != b.room {
			return cmp.Compare(b.room, a.room)
		}
		return strings.Compare(a.node, b.node)
	})
	pods, err := m.podsOf(ctx, c)
	if err != nil {
		return "", "", err
	}
	var refused []string
	for _, cand := range roomy {
		why, err := m.podsFit(ctx, pods, cand.node)
		if err != nil {
			return "", "", err
		}
		if why == "" {
			return cand.node, "", nil
		}
		refused = append(refused, why)
	}
	if to != moveapi.AnyNode {
		return "", refused[0] + " (after the move the claim's pods could run only there)", nil
	}
	return "", fmt.Sprintf("no other node with room for %s in StorageClass %s can run the claim's pods: %s",
		size.String(), class, strings.Join(refused, "; ")), nil
}

// podsOf is the pods of claim c that have not ended.
func (m *Mover) podsOf(ctx context.Context, c *corev1.PersistentVolumeClaim) ([]*corev1.Pod, error) {
	l, err := m.cfg.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	var out []*corev1.Pod
	for i := range l.Items {
		p := &l.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || !usesClaim(p, c.Name) {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// podsFit is "" when every pod may run on node, else why the first may not.
func (m *Mover) podsFit(ctx context.Context, pods []*corev1.Pod, node string) (string, error) {
	if len(pods) == 0 {
		return "", nil
	}
	n, err := m.cfg.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Sprintf("node %s is not a Node of the cluster", node), nil
	}
	if err != nil {
		return "", fmt.Errorf("reading node %s: %w", node, err)
	}
	for _, p := range pods {
		if why := podfit.Why(p, n); why != "" {
			return fmt.Sprintf("pod %s cannot run on node %s: %s", p.Name, node, why), nil
		}
	}
	return "", nil
}
