// Package pvindex is the controller's cache of carve's PVs, trimmed and
// indexed by volume handle: a volume ID does not name its node, so the
// router asks it, and the audit compares it with the nodes' LVs.
package pvindex

import (
	"context"
	"errors"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/carve-csi/carve/internal/controller/objects"
	"github.com/carve-csi/carve/internal/topology/pinned"
	"github.com/carve-csi/carve/internal/volume"
)

// ErrNotSynced is returned by a lookup before the first full list.
var ErrNotSynced = errors.New("the PersistentVolume cache has not been filled yet")

const byHandle = "handle"

// Index wraps the process's PV informer (no selector reaches
// spec.csi.driver, and csi-provisioner's PVs carry no carve label) with an
// index by handle.
type Index struct {
	driver, key string
	informer    cache.SharedIndexInformer
}

// New returns the cache of driver's PVs in objs, whose affinity is on
// topologyKey, and starts filling it.
func New(objs *objects.Cache, driver, topologyKey string) (*Index, error) {
	inf := objs.PersistentVolumes()
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
	objs.Start()
	return &Index{driver: driver, key: topologyKey, informer: inf}, nil
}

// WaitForSync waits for the first full list; false when ctx ended first.
func (x *Index) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), x.informer.HasSynced)
}

// List returns carve's PVs (trimmed).
func (x *Index) List() []*corev1.PersistentVolume {
	var out []*corev1.PersistentVolume
	for _, o := range x.informer.GetStore().List() {
		if pv, ok := o.(*corev1.PersistentVolume); ok && pv.Spec.CSI != nil && pv.Spec.CSI.Driver == x.driver {
			out = append(out, pv)
		}
	}
	return out
}

// fromHandle is what f makes of each PV the index holds for handle, where
// f says ok.
func fromHandle[T any](x *Index, handle string, f func(*corev1.PersistentVolume) (T, bool)) ([]T, error) {
	if !x.informer.HasSynced() {
		return nil, ErrNotSynced
	}
	objs, err := x.informer.GetIndexer().ByIndex(byHandle, handle)
	if err != nil {
		return nil, err
	}
	var out []T
	for _, o := range objs {
		if pv, ok := o.(*corev1.PersistentVolume); ok {
			if v, ok := f(pv); ok {
				out = append(out, v)
			}
		}
	}
	return out, nil
}

// NodesOf returns, sorted, the nodes handle's PVs are pinned to ("" for a
// PV without affinity on the key).
func (x *Index) NodesOf(handle string) ([]string, error) {
	nodes, err := fromHandle(x, handle, func(pv *corev1.PersistentVolume) (string, bool) { return pinned.Node(pv, x.key), true })
	slices.Sort(nodes)
	return slices.Compact(nodes), err
}

// PVsOf returns, sorted, the names of carve's PVs with the volume handle.
func (x *Index) PVsOf(handle string) ([]string, error) {
	names, err := fromHandle(x, handle, func(pv *corev1.PersistentVolume) (string, bool) { return pv.Name, true })
	slices.Sort(names)
	return names, err
}

// Get returns the named PV (trimmed: another driver's has no Spec.CSI), nil
// when absent.
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

// Holder is one of carve's PVs of a handle: name, node ("" for none) and
// recorded key ID ("" when plain).
type Holder struct {
	PV, Node, KeyID string
}

// HoldersOf returns carve's PVs with the volume handle, sorted by name.
func (x *Index) HoldersOf(handle string) ([]Holder, error) {
	out, err := fromHandle(x, handle, func(pv *corev1.PersistentVolume) (Holder, bool) {
		if pv.Spec.CSI == nil {
			return Holder{}, false
		}
		return Holder{PV: pv.Name, Node: pinned.Node(pv, x.key), KeyID: pv.Spec.CSI.VolumeAttributes[volume.ContextKeyID]}, true
	})
	slices.SortFunc(out, func(a, b Holder) int { return strings.Compare(a.PV, b.PV) })
	return out, err
}
