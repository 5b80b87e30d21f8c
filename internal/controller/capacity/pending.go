package capacity

import (
	"time"

	storagev1 "k8s.io/api/storage/v1"
)

// pendingTTL bounds the wait for the informer to show an own write (another
// writer's may have overtaken it, so it may never show).
const pendingTTL = 10 * time.Second

// A pendingWrite is a write the informer does not show yet: acting on its
// older copy would write again for nothing, so the item waits for the event.
type pendingWrite struct {
	obj   *storagev1.CSIStorageCapacity // nil: deleted
	until time.Time
}

// settle records a successful write of object name (obj nil: deleted) unless
// the informer shows it already. The informer updates its store before it
// calls observe, under the same lock, so the write is seen here or cleared
// there.
func (w *Writer) settle(name string, obj *storagev1.CSIStorageCapacity) {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	o, ok, _ := w.s.Load().objects.GetByKey(w.cfg.Namespace + "/" + name)
	var cur *storagev1.CSIStorageCapacity
	if ok {
		cur = w.ours(o)
	}
	if shows(cur, obj) {
		delete(w.pending, name)
		return
	}
	w.pending[name] = pendingWrite{obj: obj, until: time.Now().Add(pendingTTL)}
}

func (w *Writer) observe(c *storagev1.CSIStorageCapacity, deleted bool) {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	name := c.Name
	p, ok := w.pending[name]
	if !ok {
		return
	}
	if deleted {
		c = nil
	}
	if shows(c, p.obj) {
		delete(w.pending, name)
	}
}

func (w *Writer) awaiting(name string) (time.Duration, bool) {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	p, ok := w.pending[name]
	if !ok {
		return 0, false
	}
	left := time.Until(p.until)
	if left <= 0 {
		delete(w.pending, name)
		return 0, false
	}
	return left, true
}

// shows reports whether cur (informer's copy, nil: none) is what was written
// (nil: deleted), as far as the writer cares.
func shows(cur, written *storagev1.CSIStorageCapacity) bool {
	if cur == nil || written == nil {
		return cur == nil && written == nil
	}
	if cur.UID != written.UID || !equalQuantities(cur, written) {
		return false
	}
	for k, v := range written.Labels {
		if cur.Labels[k] != v {
			return false
		}
	}
	return true
}
