package placement

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/controller/podfit"
	"github.com/carve-csi/carve/internal/topology/pinned"
	"github.com/carve-csi/carve/internal/volume"
)

const (
	kindSnapshot = "VolumeSnapshot"
	kindClaim    = "PersistentVolumeClaim"
)

type source struct{ kind, namespace, name string }

func (s source) key() string    { return s.kind + "/" + s.namespace + "/" + s.name }
func (s source) String() string { return s.kind + " " + s.namespace + "/" + s.name }

// sourceOf is the claim's snapshot or claim source: dataSourceRef (which may
// name another namespace), else dataSource.
func sourceOf(c *corev1.PersistentVolumeClaim) (source, bool) {
	var group, kind, name string
	ns := c.Namespace
	switch r, d := c.Spec.DataSourceRef, c.Spec.DataSource; {
	case r != nil:
		kind, name = r.Kind, r.Name
		if r.APIGroup != nil {
			group = *r.APIGroup
		}
		if r.Namespace != nil && *r.Namespace != "" {
			ns = *r.Namespace
		}
	case d != nil:
		kind, name = d.Kind, d.Name
		if d.APIGroup != nil {
			group = *d.APIGroup
		}
	default:
		return source{}, false
	}
	switch {
	case group == snapshotGroup && kind == kindSnapshot, group == "" && kind == kindClaim:
		return source{kind: kind, namespace: ns, name: name}, name != ""
	}
	return source{}, false
}

// candidate tells an unbound, live claim with no selected node that
// restores or clones something.
func candidate(c *corev1.PersistentVolumeClaim) bool {
	if c.DeletionTimestamp != nil || c.Spec.VolumeName != "" || c.Status.Phase == corev1.ClaimBound {
		return false
	}
	if _, ok := c.Annotations[AnnSelectedNode]; ok {
		return false
	}
	_, ok := sourceOf(c)
	return ok
}

// outcome is a decision: result "" is none; retry asks to look again later.
type outcome struct {
	result, node, message string
	retry                 bool
}

// sync decides for the claim of key and acts; an error is a failed patch.
func (p *Placer) sync(ctx context.Context, key string) (outcome, error) {
	o, ok, err := p.claims.GetIndexer().GetByKey(key)
	if err != nil || !ok {
		return outcome{}, err
	}
	c, ok := o.(*corev1.PersistentVolumeClaim)
	if !ok {
		return outcome{}, nil
	}
	out, err := p.decide(ctx, c)
	if err != nil {
		return outcome{}, fmt.Errorf("deciding for claim %s: %w", key, err)
	}
	if out.result == "" {
		return out, nil
	}
	log := klog.FromContext(ctx).WithValues("claim", key, "result", out.result)
	if out.result == ResultPlaced {
		if err := p.place(ctx, c, out.node); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				// The claim changed (the scheduler selected a node, say): the informer
				// brings it again.
				log.V(2).Info("The claim changed before carve selected its node", "err", err.Error())
				return outcome{}, nil
			}
			return out, fmt.Errorf("selecting node %s for claim %s: %w", out.node, key, err)
		}
		log.Info("Selected the source's node for a restore or clone", "node", out.node)
	} else {
		log.V(2).Info("Not selecting a node", "why", out.message)
	}
	p.tell(c, out)
	return out, nil
}

func (p *Placer) tell(c *corev1.PersistentVolumeClaim, out outcome) {
	p.mu.Lock()
	same := p.told[c.UID] == out.result
	p.told[c.UID] = out.result
	p.mu.Unlock()
	if same {
		return
	}
	p.decisions.WithLabelValues(out.result).Inc()
	reason := ReasonNotPlaced
	if out.result == ResultPlaced {
		reason = ReasonPlaced
	}
	p.cfg.Events.Event(c, corev1.EventTypeNormal, reason, out.message)
}

// place sets the selected node if the claim's resourceVersion is unchanged.
func (p *Placer) place(ctx context.Context, c *corev1.PersistentVolumeClaim, node string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": c.ResourceVersion,
		"annotations":     map[string]string{AnnSelectedNode: node, AnnPlaced: node},
	}})
	if err != nil {
		return err
	}
	_, err = p.cfg.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// decide is the decision for claim c (see the package comment); an error is
// a failed API read.
func (p *Placer) decide(ctx context.Context, c *corev1.PersistentVolumeClaim) (outcome, error) {
	if !candidate(c) {
		return outcome{}, nil
	}
	src, _ := sourceOf(c)
	sc := p.class(c)
	if sc == nil || sc.Provisioner != p.cfg.Driver || sc.VolumeBindingMode == nil ||
		*sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		return outcome{}, nil
	}
	if n := c.Annotations[AnnPlaced]; n != "" {
		return outcome{result: ResultPlacedBefore, message: fmt.Sprintf(
			"PlacedBefore: the claim carries %s=%s: carve selected a node for it once (a selection taken back since: the node refused the volume), or the claim is to be left to the scheduler; the scheduler chooses the node for %s",
			AnnPlaced, n, src)}, nil
	}
	pods := p.waiting(c)
	if len(pods) == 0 {
		// Where the pods may run is unknown until one exists; onPod looks again.
		return outcome{}, nil
	}
	node, out := p.sourceNode(src)
	if out.result != "" {
		return out, nil
	}
	cannot := func(format string, args ...any) outcome {
		return outcome{result: ResultPodCannotRun, message: fmt.Sprintf("PodCannotRunThere: %s lives on node %s, ", src, node) +
			fmt.Sprintf(format, args...) + "; the scheduler chooses the node, and the volume is copied there from the source's node (where the StorageClass allows copies across nodes)"}
	}
	o, _, _ := p.nodes.GetIndexer().GetByKey(node)
	n, _ := o.(*corev1.Node)
	if n == nil {
		return cannot("which is not a Node of the cluster"), nil
	}
	for _, pod := range pods {
		if why := podfit.Why(pod, n); why != "" {
			return cannot("where pod %s cannot run: %s", pod.Name, why), nil
		}
		if why := p.otherVolumes(pod, c.Name, n); why != "" {
			return cannot("where pod %s cannot run: %s", pod.Name, why), nil
		}
	}
	dc := sc.Parameters[volume.ParamDeviceClass]
	class := fmt.Sprintf("device class %q", dc)
	if dc == "" {
		class = "its default device class"
	}
	want := c.Spec.Resources.Requests[corev1.ResourceStorage]
	room, ok := p.cfg.Capacity.MaxVolume(node, dc)
	if !ok {
		return outcome{result: ResultSourceNodeUnreachable, retry: true, message: fmt.Sprintf(
			"SourceNodeUnreachable: %s lives on node %s, whose carve node agent is not connected to the controller, so its room is not known; the scheduler chooses the node",
			src, node)}, nil
	}
	if want.Value() > room {
		return outcome{result: ResultSourceNodeFull, message: fmt.Sprintf(
			"SourceNodeFull: %s lives on node %s, which can make volumes of at most %s in %s (StorageClass %s); the claim asks %s; the scheduler chooses the node",
			src, node, bytes(room), class, sc.Name, want.String())}, nil
	}
	// Last, as it asks the API server; "0" lets its cache answer.
	bound, err := p.cfg.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(), ResourceVersion: "0"})
	if err != nil {
		return outcome{}, fmt.Errorf("listing the pods on node %s: %w", node, err)
	}
	if why := podfit.Room(n, bound.Items, pods...); why != "" {
		return cannot("where the claim's pods do not fit: %s", why), nil
	}
	names := make([]string, len(pods))
	for i, pod := range pods {
		names[i] = pod.Name
	}
	return outcome{result: ResultPlaced, node: node, message: fmt.Sprintf(
		"Selected node %s, where %s lives: it has room for %s in %s (StorageClass %s, at most %s now), and the pods waiting for the claim (%s) can run there",
		node, src, want.String(), class, sc.Name, bytes(room), strings.Join(names, ", "))}, nil
}

func (p *Placer) waiting(c *corev1.PersistentVolumeClaim) []*corev1.Pod {
	objs, err := p.pods.GetIndexer().ByIndex(byClaim, c.Namespace+"/"+c.Name)
	if err != nil {
		return nil // only an unknown index fails; it is set up in setupInformers
	}
	var out []*corev1.Pod
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok && pod.Spec.NodeName == "" && pod.DeletionTimestamp == nil && pod.Status.Phase == corev1.PodPending {
			out = append(out, pod)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// otherVolumes is "" when the pod's other claims allow node n (no bound PV
// whose affinity excludes n, no other node selected).
func (p *Placer) otherVolumes(pod *corev1.Pod, claim string, n *corev1.Node) string {
	for _, name := range claimsOf(pod) {
		if name == claim {
			continue
		}
		o, ok, err := p.claims.GetIndexer().GetByKey(pod.Namespace + "/" + name)
		if err != nil || !ok {
			continue
		}
		other, _ := o.(*corev1.PersistentVolumeClaim)
		if other == nil {
			continue
		}
		if sel := other.Annotations[AnnSelectedNode]; other.Spec.VolumeName == "" && sel != "" && sel != n.Name {
			return fmt.Sprintf("it also uses claim %s, for which node %s is selected", name, sel)
		}
		if other.Spec.VolumeName == "" {
			continue
		}
		pv, err := p.cfg.PVs.Get(other.Spec.VolumeName)
		if err != nil || pv == nil || pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
			continue
		}
		if ok, err := nodeaffinity.NewLazyErrorNodeSelector(pv.Spec.NodeAffinity.Required).Match(n); err != nil || !ok {
			return fmt.Sprintf("it also uses claim %s, whose PersistentVolume %s's node affinity excludes the node", name, pv.Name)
		}
	}
	return ""
}

func (p *Placer) class(c *corev1.PersistentVolumeClaim) *storagev1.StorageClass {
	if c.Spec.StorageClassName == nil || *c.Spec.StorageClassName == "" {
		return nil
	}
	o, ok, err := p.classes.GetIndexer().GetByKey(*c.Spec.StorageClassName)
	if err != nil || !ok {
		return nil
	}
	sc, _ := o.(*storagev1.StorageClass)
	return sc
}

// sourceNode is src's node, or the outcome saying why it is unknown.
func (p *Placer) sourceNode(src source) (string, outcome) {
	unknown := func(format string, args ...any) (string, outcome) {
		return "", outcome{result: ResultSourceNodeUnknown, retry: true,
			message: "SourceNodeUnknown: " + fmt.Sprintf(format, args...) + "; the scheduler chooses the node unless it becomes known first"}
	}
	notCarve := func(what string) (string, outcome) {
		return "", outcome{result: ResultSourceNotCarve, message: fmt.Sprintf(
			"SourceNotCarve: %s is not a volume of %s (%s); carve cannot restore or clone it", src, p.cfg.Driver, what)}
	}
	if src.kind == kindClaim {
		o, ok, err := p.claims.GetIndexer().GetByKey(src.namespace + "/" + src.name)
		if err != nil || !ok {
			return unknown("%s does not exist", src)
		}
		from, _ := o.(*corev1.PersistentVolumeClaim)
		if from == nil || from.Spec.VolumeName == "" {
			return unknown("%s is not bound yet", src)
		}
		pv, err := p.cfg.PVs.Get(from.Spec.VolumeName)
		switch {
		case err != nil:
			return unknown("the PersistentVolume of %s is not known yet: %v", src, err)
		case pv == nil:
			return unknown("its PersistentVolume %s is not known yet", from.Spec.VolumeName)
		case pv.Spec.CSI == nil || pv.Spec.CSI.Driver != p.cfg.Driver:
			return notCarve("PersistentVolume " + pv.Name + " is another driver's")
		}
		if n := pinned.Node(pv, p.cfg.TopologyKey); n != "" {
			return n, outcome{}
		}
		return unknown("its PersistentVolume %s names no node under %s", pv.Name, p.cfg.TopologyKey)
	}

	if !p.snapshots.HasSynced() || !p.contents.HasSynced() {
		return unknown("the controller has not listed the VolumeSnapshots yet (are the snapshot CRDs installed?)")
	}
	o, ok, err := p.snapshots.GetIndexer().GetByKey(src.namespace + "/" + src.name)
	if err != nil || !ok {
		return unknown("%s does not exist", src)
	}
	vs, _ := o.(*unstructured.Unstructured)
	content, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
	if content == "" {
		content, _, _ = unstructured.NestedString(vs.Object, "spec", "source", "volumeSnapshotContentName")
	}
	if content == "" {
		return unknown("%s is not bound to a VolumeSnapshotContent yet", src)
	}
	o, ok, err = p.contents.GetIndexer().GetByKey(content)
	if err != nil || !ok {
		return unknown("its VolumeSnapshotContent %s does not exist", content)
	}
	vsc, _ := o.(*unstructured.Unstructured)
	if d, _, _ := unstructured.NestedString(vsc.Object, "spec", "driver"); d != p.cfg.Driver {
		return notCarve(fmt.Sprintf("VolumeSnapshotContent %s is driver %q's", content, d))
	}
	handle, _, _ := unstructured.NestedString(vsc.Object, "status", "snapshotHandle")
	if handle == "" {
		handle, _, _ = unstructured.NestedString(vsc.Object, "spec", "source", "snapshotHandle")
	}
	if handle == "" {
		return unknown("its VolumeSnapshotContent %s has no snapshot handle yet", content)
	}
	node, _, _, err := volume.ParseSnapshotID(handle)
	if err != nil {
		return notCarve(fmt.Sprintf("VolumeSnapshotContent %s's handle %q is not a carve snapshot ID: %v", content, handle, err))
	}
	return node, outcome{}
}

func bytes(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }
