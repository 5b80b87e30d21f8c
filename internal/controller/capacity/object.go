package capacity

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"
)

// Labels of the writer's objects: it finds its own by LabelManagedBy and LabelDriver;
// LabelNode and LabelStorageClass are for kubectl -l.
const (
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	ManagedBy         = "carve-controller"
	LabelDriver       = "carve.dev/driver"
	LabelNode         = "carve.dev/node"
	LabelStorageClass = "carve.dev/storage-class"
)

const (
	indexKey  = "key"
	indexNode = "node"
	indexSC   = "storageClass"
)

type key struct{ node, sc string }

// String is unambiguous: neither name may contain a slash.
func (k key) String() string { return k.node + "/" + k.sc }

// item is the object of key or, when stray is set, a labelled object whose
// node or class cannot be read; it is deleted.
type item struct {
	key
	stray string
}

// objectName hashes driver, node and class so replicas and restarts agree on
// the name and a create is idempotent (the names together may be too long).
func (w *Writer) objectName(k key) string {
	sum := sha256.Sum256([]byte(w.cfg.Driver + "\x00" + k.node + "\x00" + k.sc))
	return "carve-" + hex.EncodeToString(sum[:16])
}

func labelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + hex.EncodeToString(sum[:20])
}

func (w *Writer) labels(k key) map[string]string {
	l := maps.Clone(map[string]string(w.selector))
	l[LabelNode] = labelValue(k.node)
	l[LabelStorageClass] = labelValue(k.sc)
	return l
}

// keyOf reads c's node and class; false when c is not shaped like ours.
func (w *Writer) keyOf(c *storagev1.CSIStorageCapacity) (key, bool) {
	t := c.NodeTopology
	if t == nil || len(t.MatchExpressions) != 0 || len(t.MatchLabels) != 1 || c.StorageClassName == "" {
		return key{}, false
	}
	node := t.MatchLabels[w.cfg.TopologyKey]
	if node == "" {
		return key{}, false
	}
	return key{node: node, sc: c.StorageClassName}, true
}

func (w *Writer) itemOf(c *storagev1.CSIStorageCapacity) item {
	if k, ok := w.keyOf(c); ok {
		return item{key: k}
	}
	return item{stray: c.Name}
}

func (w *Writer) indexBy(f func(key) string) cache.IndexFunc {
	return func(o any) ([]string, error) {
		c := w.ours(o)
		if c == nil {
			return nil, nil
		}
		k, ok := w.keyOf(c)
		if !ok {
			return nil, nil
		}
		return []string{f(k)}, nil
	}
}

// ours unwraps an informer's object; nil if not this writer's (the watch's
// selector says so too; this does not depend on it).
func (w *Writer) ours(o any) *storagev1.CSIStorageCapacity {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	c, _ := o.(*storagev1.CSIStorageCapacity)
	if c == nil || !w.sel.Matches(labels.Set(c.Labels)) {
		return nil
	}
	return c
}

func (w *Writer) build(k key, c classCapacity) *storagev1.CSIStorageCapacity {
	o := &storagev1.CSIStorageCapacity{
		ObjectMeta: metav1.ObjectMeta{
			Name:      w.objectName(k),
			Namespace: w.cfg.Namespace,
			Labels:    w.labels(k),
		},
		NodeTopology:     &metav1.LabelSelector{MatchLabels: map[string]string{w.cfg.TopologyKey: k.node}},
		StorageClassName: k.sc,
	}
	if w.cfg.Owner != nil {
		o.OwnerReferences = []metav1.OwnerReference{*w.cfg.Owner}
	}
	set(o, c)
	return o
}

func set(o *storagev1.CSIStorageCapacity, c classCapacity) {
	o.Capacity = resource.NewQuantity(c.available, resource.BinarySI)
	o.MaximumVolumeSize = resource.NewQuantity(c.maxVolume, resource.BinarySI)
}

// holds reports whether o holds c and the writer's labels (an object whose
// labels were changed drops out of the informer's view: they are put back).
func (w *Writer) holds(o *storagev1.CSIStorageCapacity, k key, c classCapacity) bool {
	for name, v := range w.labels(k) {
		if o.Labels[name] != v {
			return false
		}
	}
	return equalQuantity(o.Capacity, c.available) && equalQuantity(o.MaximumVolumeSize, c.maxVolume)
}

func equalQuantity(q *resource.Quantity, v int64) bool {
	return q != nil && q.Cmp(*resource.NewQuantity(v, resource.BinarySI)) == 0
}

func equalQuantities(a, b *storagev1.CSIStorageCapacity) bool {
	eq := func(x, y *resource.Quantity) bool {
		if x == nil || y == nil {
			return x == y
		}
		return x.Cmp(*y) == 0
	}
	return eq(a.Capacity, b.Capacity) && eq(a.MaximumVolumeSize, b.MaximumVolumeSize)
}
