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

// Labels of every object the writer makes. The writer finds its own
// objects by LabelManagedBy and LabelDriver; LabelNode and LabelStorageClass
// are for people (kubectl -l): the node or class name when it is a valid
// label value, else a hash of it. The writer itself reads the node and
// the class from the object's nodeTopology and storageClassName.
const (
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	ManagedBy         = "carve-controller"
	LabelDriver       = "carve.dev/driver"
	LabelNode         = "carve.dev/node"
	LabelStorageClass = "carve.dev/storage-class"
)

// Indexes of the objects informer.
const (
	indexKey  = "key"
	indexNode = "node"
	indexSC   = "storageClass"
)

// key is one object: a node and a StorageClass.
type key struct{ node, sc string }

// String is unambiguous: neither name may contain a slash.
func (k key) String() string { return k.node + "/" + k.sc }

// item is a unit of work: the object of key, or, when stray is set, the
// object of that name, which carries the writer's labels but names no
// node or class it can read; it is deleted.
type item struct {
	key
	stray string
}

// objectName is the deterministic name of k's object, so that replicas
// and restarts agree on it and a create is idempotent: a hash of the
// driver, the node and the class (node and class names may be longer than
// a name allows together).
func (w *Writer) objectName(k key) string {
	sum := sha256.Sum256([]byte(w.cfg.Driver + "\x00" + k.node + "\x00" + k.sc))
	return "carve-" + hex.EncodeToString(sum[:16])
}

// labelValue is s when it is a valid label value, else a hash of it.
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

// keyOf reads the node and class of c; false when c is not shaped like
// the writer's objects.
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

// ours unwraps an informer's object; nil if it is not an object of this
// writer (the label selector of the watch says so too; this does not
// depend on it).
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

// build is a new object of k holding c.
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

// holds reports whether o holds c and the writer's labels (an object
// whose labels were changed drops out of the informer's view: the writer
// puts them back).
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

// equalQuantities reports whether a and b hold the same capacity and
// maximum volume size.
func equalQuantities(a, b *storagev1.CSIStorageCapacity) bool {
	eq := func(x, y *resource.Quantity) bool {
		if x == nil || y == nil {
			return x == y
		}
		return x.Cmp(*y) == 0
	}
	return eq(a.Capacity, b.Capacity) && eq(a.MaximumVolumeSize, b.MaximumVolumeSize)
}
