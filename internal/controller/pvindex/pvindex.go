// Package pvindex keeps carve controller's cache of carve's
// PersistentVolumes, trimmed to what the controller reads (handle, node,
// claim, phase) and indexed by volume handle. The router asks it which
// node holds a volume, since a volume ID does not name its node; the
// audit compares it with the nodes' LVs.
package pvindex

import (
	"context"
	"errors"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/carve-csi/carve/internal/topology/pinned"
)

// ErrNotSynced is returned by a lookup before the cache holds its first
// full list: the answer is not known yet.
var ErrNotSynced = errors.New("the PersistentVolume cache has not been filled yet")

// moveAnnotations is the prefix of the annotations of a move
// (api/moveapi.AnnPrefix): the audit and the router read them.
const moveAnnotations = "carve.dev/move-"

// byHandle is the name of the index on spec.csi.volumeHandle.
const byHandle = "handle"

// Index is the cache. Its informer watches every PersistentVolume (no
// selector reaches spec.csi.driver, and csi-provisioner's PVs carry no carve
// label); the transform keeps a foreign PV's name only, and of carve's the
// handle, node affinity, claim, reclaim policy, phase and move annotations:
// a few hundred bytes per PV.
type Index struct {
	driver, key string
	factory     informers.SharedInformerFactory
	informer    cache.SharedIndexInformer
}

// New returns the cache of driver's PVs, whose node affinity is on
// topologyKey; it fills once Run runs.
func New(client kubernetes.Interface, driver, topologyKey string) (*Index, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(Trim(driver)))
	inf := factory.Core().V1().PersistentVolumes().Informer()
	err := inf.AddIndexers(cache.Indexers{byHandle: func(o any) ([]string, error) {
		pv, ok := o.(*corev1.PersistentVolume)
		if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver {
			return nil, nil
		}
		return []string{pv.Spec.CSI.VolumeHandle}, nil
	}})
	if err != nil {
		return nil, err
	}
	return &Index{driver: driver, key: topologyKey, factory: factory, informer: inf}, nil
}

// Run fills and keeps the cache until ctx ends.
func (x *Index) Run(ctx context.Context) error {
	x.factory.Start(ctx.Done())
	<-ctx.Done()
	x.factory.Shutdown()
	return nil
}

// WaitForSync waits until the cache holds its first full list; false when
// ctx ended first.
func (x *Index) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), x.informer.HasSynced)
}

// List returns carve's PVs as the cache holds them (trimmed).
func (x *Index) List() []*corev1.PersistentVolume {
	var out []*corev1.PersistentVolume
	for _, o := range x.informer.GetStore().List() {
		if pv, ok := o.(*corev1.PersistentVolume); ok && pv.Spec.CSI != nil && pv.Spec.CSI.Driver == x.driver {
			out = append(out, pv)
		}
	}
	return out
}

// NodesOf returns, sorted, the nodes that carve's PVs with the volume
// handle are pinned to (none: no PV has it; a PV without a node affinity
// on the topology key adds ""). ErrNotSynced before the first full list.
func (x *Index) NodesOf(handle string) ([]string, error) {
	if !x.informer.HasSynced() {
		return nil, ErrNotSynced
	}
	objs, err := x.informer.GetIndexer().ByIndex(byHandle, handle)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, o := range objs {
		if pv, ok := o.(*corev1.PersistentVolume); ok && !slices.Contains(nodes, pinned.Node(pv, x.key)) {
			nodes = append(nodes, pinned.Node(pv, x.key))
		}
	}
	slices.Sort(nodes)
	return nodes, nil
}

// PVsOf returns, sorted, the names of carve's PVs with the volume handle.
// ErrNotSynced before the first full list.
func (x *Index) PVsOf(handle string) ([]string, error) {
	if !x.informer.HasSynced() {
		return nil, ErrNotSynced
	}
	objs, err := x.informer.GetIndexer().ByIndex(byHandle, handle)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, o := range objs {
		if pv, ok := o.(*corev1.PersistentVolume); ok {
			names = append(names, pv.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Trim is the informer's transform: what the controller does not read
// never reaches the cache.
func Trim(driver string) cache.TransformFunc {
	return func(o any) (any, error) {
		pv, ok := o.(*corev1.PersistentVolume)
		if !ok {
			return o, nil // a tombstone: keep as it is
		}
		out := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv.Name, UID: pv.UID,
			ResourceVersion: pv.ResourceVersion, DeletionTimestamp: pv.DeletionTimestamp}}
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver {
			return out, nil
		}
		out.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: pv.Spec.CSI.Driver, VolumeHandle: pv.Spec.CSI.VolumeHandle}
		out.Spec.NodeAffinity = pv.Spec.NodeAffinity
		out.Spec.ClaimRef = pv.Spec.ClaimRef
		out.Spec.PersistentVolumeReclaimPolicy = pv.Spec.PersistentVolumeReclaimPolicy
		out.Status.Phase = pv.Status.Phase
		for k, v := range pv.Annotations {
			if strings.HasPrefix(k, moveAnnotations) {
				if out.Annotations == nil {
					out.Annotations = map[string]string{}
				}
				out.Annotations[k] = v
			}
		}
		return out, nil
	}
}

// Get returns the PV of that name as the cache holds it (trimmed: a PV of
// another driver has no Spec.CSI), nil when the cache has none.
// ErrNotSynced before the first full list.
func (x *Index) Get(name string) (*corev1.PersistentVolume, error) {
	if !x.informer.HasSynced() {
		return nil, ErrNotSynced
	}
	o, ok, err := x.informer.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, err
	}
	pv, _ := o.(*corev1.PersistentVolume)
	return pv, nil
}
