package placement

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// bySource indexes claims by source so its changes requeue them; byClaim
// indexes pending pods by claim.
const (
	bySource = "source"
	byClaim  = "claim"
)

// setupInformers sets up the unscheduled pods and snapshot informers.
func (p *Placer) setupInformers() error {
	// Only pods without a node: the ones placement decides for, and few.
	p.podFactory = informers.NewSharedInformerFactoryWithOptions(p.cfg.Client, 0, informers.WithTransform(trimPods),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", "").String()
		}))
	p.pods = p.podFactory.Core().V1().Pods().Informer()
	if err := p.pods.AddIndexers(cache.Indexers{byClaim: func(o any) ([]string, error) {
		if pod, ok := o.(*corev1.Pod); ok {
			var keys []string
			for _, c := range claimsOf(pod) {
				keys = append(keys, pod.Namespace+"/"+c)
			}
			return keys, nil
		}
		return nil, nil
	}}); err != nil {
		return fmt.Errorf("restore placement: indexing pods: %w", err)
	}
	if _, err := p.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.onPod,
		UpdateFunc: func(_, o any) { p.onPod(o) },
	}); err != nil {
		return fmt.Errorf("restore placement: watching pods: %w", err)
	}
	p.dyn = dynamicinformer.NewFilteredDynamicSharedInformerFactory(p.cfg.Dynamic, 0, metav1.NamespaceAll, nil)
	p.snapshots = p.dyn.ForResource(VolumeSnapshots).Informer()
	p.contents = p.dyn.ForResource(VolumeSnapshotContents).Informer()
	for _, s := range []struct {
		inf  cache.SharedIndexInformer
		keep [][]string
		of   func(*unstructured.Unstructured) string
	}{
		{p.snapshots, snapshotFields, func(u *unstructured.Unstructured) string {
			return source{kind: kindSnapshot, namespace: u.GetNamespace(), name: u.GetName()}.key()
		}},
		{p.contents, contentFields, func(u *unstructured.Unstructured) string {
			ns, _, _ := unstructured.NestedString(u.Object, "spec", "volumeSnapshotRef", "namespace")
			name, _, _ := unstructured.NestedString(u.Object, "spec", "volumeSnapshotRef", "name")
			return source{kind: kindSnapshot, namespace: ns, name: name}.key()
		}},
	} {
		if err := s.inf.SetTransform(trimUnstructured(s.keep)); err != nil {
			return fmt.Errorf("restore placement: %w", err)
		}
		changed := func(o any) {
			if u, ok := o.(*unstructured.Unstructured); ok {
				p.enqueueBySource(s.of(u))
			}
		}
		if _, err := s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: changed, UpdateFunc: func(_, o any) { changed(o) },
		}); err != nil {
			return fmt.Errorf("restore placement: watching snapshots: %w", err)
		}
	}
	return nil
}

// watchShared indexes and follows the claims, StorageClasses and Nodes of
// the process's cache (started by the caller); stop removes the handler.
func (p *Placer) watchShared() (stop func(), err error) {
	p.claims, p.classes, p.nodes = p.cfg.Objects.Claims(), p.cfg.Objects.StorageClasses(), p.cfg.Objects.Nodes()
	if err := p.claims.AddIndexers(cache.Indexers{bySource: func(o any) ([]string, error) {
		if c, ok := o.(*corev1.PersistentVolumeClaim); ok {
			if s, ok := sourceOf(c); ok {
				return []string{s.key()}, nil
			}
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("restore placement: indexing claims: %w", err)
	}
	reg, err := p.claims.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.onClaim,
		UpdateFunc: p.onClaimUpdate,
		DeleteFunc: p.onClaimDeleted,
	})
	if err != nil {
		return nil, fmt.Errorf("restore placement: watching claims: %w", err)
	}

	return func() { _ = p.claims.RemoveEventHandler(reg) }, nil // fails only once the informer stopped
}

// onClaim queues a claim to place and the claims that clone it.
func (p *Placer) onClaim(o any) {
	c, ok := o.(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	if candidate(c) {
		p.queue.Add(c.Namespace + "/" + c.Name)
	}
	p.enqueueBySource(source{kind: kindClaim, namespace: c.Namespace, name: c.Name}.key())
}

// onClaimUpdate is onClaim, except that a claim whose selected node was
// just taken back waits takenBackDelay: a selection patched before
// csi-provisioner's cache caught up would be overwritten there by the older
// claim, and the claim would wait for the next resync.
func (p *Placer) onClaimUpdate(old, o any) {
	before, ok1 := old.(*corev1.PersistentVolumeClaim)
	c, ok2 := o.(*corev1.PersistentVolumeClaim)
	if ok1 && ok2 && before.Annotations[AnnSelectedNode] != "" && candidate(c) {
		p.queue.AddAfter(c.Namespace+"/"+c.Name, p.takenBackDelay)
		p.enqueueBySource(source{kind: kindClaim, namespace: c.Namespace, name: c.Name}.key())
		return
	}
	p.onClaim(o)
}

func (p *Placer) onClaimDeleted(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	if c, ok := o.(*corev1.PersistentVolumeClaim); ok {
		p.mu.Lock()
		delete(p.told, c.UID)
		p.mu.Unlock()
	}
}

// onPod queues the claims of a pending pod: a restore or clone is placed
// only once a pod waits for it.
func (p *Placer) onPod(o any) {
	pod, ok := o.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != "" {
		return
	}
	for _, name := range claimsOf(pod) {
		key := pod.Namespace + "/" + name
		if c, ok, err := p.claims.GetIndexer().GetByKey(key); err == nil && ok {
			if c, ok := c.(*corev1.PersistentVolumeClaim); ok && candidate(c) {
				p.queue.Add(key)
			}
		}
	}
}

// claimsOf names pod's claims, including generic ephemeral ones
// (<pod>-<volume>).
func claimsOf(pod *corev1.Pod) []string {
	var out []string
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			out = append(out, pod.Name+"-"+v.Name)
		}
	}
	return out
}

func (p *Placer) enqueueBySource(key string) {
	objs, err := p.claims.GetIndexer().ByIndex(bySource, key)
	if err != nil {
		return // only an unknown index fails; it is set up above
	}
	for _, o := range objs {
		if c, ok := o.(*corev1.PersistentVolumeClaim); ok && candidate(c) {
			p.queue.Add(c.Namespace + "/" + c.Name)
		}
	}
}

func trimPods(o any) (any, error) {
	if v, ok := o.(*corev1.Pod); ok {
		return trimPod(v), nil
	}
	return o, nil // a tombstone: kept as it is
}

// trimPod keeps where a pod may run (podfit) and which claims it uses.
func trimPod(v *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: v.Name, Namespace: v.Namespace, UID: v.UID,
		ResourceVersion: v.ResourceVersion, DeletionTimestamp: v.DeletionTimestamp}}
	out.Spec.NodeName = v.Spec.NodeName
	out.Spec.NodeSelector = v.Spec.NodeSelector
	if a := v.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		out.Spec.Affinity = &corev1.Affinity{NodeAffinity: a.NodeAffinity}
	}
	out.Spec.Tolerations = v.Spec.Tolerations
	out.Spec.Overhead = v.Spec.Overhead
	out.Spec.Resources = v.Spec.Resources
	for _, vol := range v.Spec.Volumes {
		switch {
		case vol.PersistentVolumeClaim != nil:
			out.Spec.Volumes = append(out.Spec.Volumes, corev1.Volume{Name: vol.Name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: vol.PersistentVolumeClaim}})
		case vol.Ephemeral != nil:
			out.Spec.Volumes = append(out.Spec.Volumes, corev1.Volume{Name: vol.Name, VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}})
		}
	}
	for _, c := range v.Spec.InitContainers {
		out.Spec.InitContainers = append(out.Spec.InitContainers, corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy})
	}
	for _, c := range v.Spec.Containers {
		out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Resources: c.Resources})
	}
	out.Status.Phase = v.Status.Phase
	return out
}

var (
	snapshotFields = [][]string{{"spec", "source"}, {"status", "boundVolumeSnapshotContentName"}}
	contentFields  = [][]string{{"spec", "driver"}, {"spec", "source", "snapshotHandle"}, {"spec", "volumeSnapshotRef", "namespace"},
		{"spec", "volumeSnapshotRef", "name"}, {"status", "snapshotHandle"}}
)

func trimUnstructured(keep [][]string) cache.TransformFunc {
	return func(o any) (any, error) {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			return o, nil
		}
		out := &unstructured.Unstructured{Object: map[string]any{}}
		out.SetAPIVersion(u.GetAPIVersion())
		out.SetKind(u.GetKind())
		out.SetName(u.GetName())
		out.SetNamespace(u.GetNamespace())
		out.SetUID(u.GetUID())
		out.SetResourceVersion(u.GetResourceVersion())
		for _, path := range keep {
			if v, found, err := unstructured.NestedFieldNoCopy(u.Object, path...); err == nil && found {
				if err := unstructured.SetNestedField(out.Object, v, path...); err != nil {
					return nil, fmt.Errorf("trimming %s %s: %w", u.GetKind(), u.GetName(), err)
				}
			}
		}
		return out, nil
	}
}
