package capacity

import (
	"context"
	"errors"
	"fmt"
	"maps"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/controller/loop"
)

// Values of carve_capacity_object_writes_total's op and result labels.
const (
	opCreate       = "create"
	opUpdate       = "update"
	opDelete       = "delete"
	resultSuccess  = "success"
	resultConflict = "conflict"
	resultError    = "error"
)

// attempts bounds re-reads of a stale object in one sync; then backoff.
const attempts = 3

var errStale = errors.New("object changed while being written")

// syncItem writes one object. An object refused as invalid is not retried:
// a new report or StorageClass event queues the pair again.
func (w *Writer) syncItem(ctx context.Context, it item, _ int) (loop.Result, error) {
	err := w.sync(ctx, it)
	if err != nil && permanent(err) {
		klog.FromContext(ctx).Error(err, "The API server refuses the CSIStorageCapacity; not retrying", "node", it.node, "storageClass", it.sc)
		return loop.Result{}, nil
	}
	return loop.Result{}, err
}

// permanent reports whether every error in err is an invalid-object refusal
// (a node name too long for nodeTopology's label value, say).
func permanent(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !permanent(e) {
				return false
			}
		}
		return len(j.Unwrap()) > 0
	}
	return apierrors.IsInvalid(err)
}

func (w *Writer) sync(ctx context.Context, it item) error {
	s := w.s.Load()
	if it.stray != "" {
		o, ok, _ := s.objects.GetByKey(w.cfg.Namespace + "/" + it.stray)
		if c := w.ours(o); ok && c != nil {
			if _, readable := w.keyOf(c); !readable {
				return w.delete(ctx, c, "it names no node or StorageClass")
			}
		}
		return nil
	}
	k := it.key
	name := w.objectName(k)
	if left, ok := w.awaiting(name); ok {
		// The informer's event of the last write queues it again.
		s.queue.AddAfter(it, left)
		return nil
	}
	objs, err := s.objects.ByIndex(indexKey, k.String())
	if err != nil {
		return fmt.Errorf("listing the objects of %s: %w", k, err)
	}
	var cur *storagev1.CSIStorageCapacity
	var errs []error
	for _, o := range objs {
		c := w.ours(o)
		switch {
		case c == nil:
		case c.Name == name:
			cur = c
		default:
			errs = append(errs, w.delete(ctx, c, "another object holds node "+k.node+" and StorageClass "+k.sc))
		}
	}
	want, act, after := w.desired(ctx, k)
	switch {
	case after > 0:
		s.queue.AddAfter(it, after)
	case !act:
	case want == nil && cur != nil:
		errs = append(errs, w.delete(ctx, cur, "no node or StorageClass wants it"))
	case want != nil:
		errs = append(errs, w.apply(ctx, k, cur, *want))
	}
	return errors.Join(errs...)
}

// apply creates or updates k's object to hold want; cur is the informer's
// possibly stale view, so Conflict, AlreadyExists or NotFound re-read it.
func (w *Writer) apply(ctx context.Context, k key, cur *storagev1.CSIStorageCapacity, want classCapacity) error {
	api := w.cfg.Client.StorageV1().CSIStorageCapacities(w.cfg.Namespace)
	for range attempts {
		if cur == nil {
			created, err := api.Create(ctx, w.build(k, want), metav1.CreateOptions{})
			w.count(opCreate, err)
			switch {
			case err == nil:
				w.wrote(ctx, "Created", k, created)
				return nil
			case !apierrors.IsAlreadyExists(err):
				return fmt.Errorf("creating the CSIStorageCapacity of node %s, StorageClass %s: %w", k.node, k.sc, err)
			}
			cur, err = w.get(ctx, w.objectName(k))
			if err != nil {
				return err
			}
			continue
		}
		if got, ok := w.keyOf(cur); !ok || got != k {
			// Another pair's object by this name: node and class cannot change, so it
			// goes and k's is made next time.
			if err := w.delete(ctx, cur, "its name belongs to node "+k.node+" and StorageClass "+k.sc); err != nil {
				return err
			}
			return errStale
		}
		if w.holds(cur, k, want) {
			return nil
		}
		upd := cur.DeepCopy()
		set(upd, want)
		if upd.Labels == nil {
			upd.Labels = map[string]string{}
		}
		maps.Copy(upd.Labels, w.labels(k))
		updated, err := api.Update(ctx, upd, metav1.UpdateOptions{})
		w.count(opUpdate, err)
		switch {
		case err == nil:
			w.wrote(ctx, "Updated", k, updated)
			return nil
		case apierrors.IsNotFound(err):
			cur = nil
		case apierrors.IsConflict(err):
			if cur, err = w.get(ctx, cur.Name); err != nil {
				return err
			}
		default:
			return fmt.Errorf("updating CSIStorageCapacity %s (node %s, StorageClass %s): %w", cur.Name, k.node, k.sc, err)
		}
	}
	return fmt.Errorf("CSIStorageCapacity %s (node %s, StorageClass %s): %w", w.objectName(k), k.node, k.sc, errStale)
}

// wrote settles obj, k's object just written (done says how), and logs it.
func (w *Writer) wrote(ctx context.Context, done string, k key, obj *storagev1.CSIStorageCapacity) {
	w.settle(obj.Name, obj)
	klog.FromContext(ctx).V(2).Info(done+" CSIStorageCapacity", "object", obj.Name, "node", k.node, "storageClass", k.sc,
		"capacity", obj.Capacity, "maximumVolumeSize", obj.MaximumVolumeSize)
}

func (w *Writer) get(ctx context.Context, name string) (*storagev1.CSIStorageCapacity, error) {
	c, err := w.cfg.Client.StorageV1().CSIStorageCapacities(w.cfg.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading CSIStorageCapacity %s: %w", name, err)
	}
	return c, nil
}

// delete deletes c only if its UID is unchanged, so an object made again
// meanwhile survives.
func (w *Writer) delete(ctx context.Context, c *storagev1.CSIStorageCapacity, why string) error {
	err := w.cfg.Client.StorageV1().CSIStorageCapacities(w.cfg.Namespace).Delete(ctx, c.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID}})
	w.count(opDelete, err)
	switch {
	case err == nil:
		w.settle(c.Name, nil)
		klog.FromContext(ctx).V(2).Info("Deleted CSIStorageCapacity", "object", c.Name, "reason", why)
		return nil
	case apierrors.IsNotFound(err):
		w.settle(c.Name, nil)
		return nil
	case apierrors.IsConflict(err):
		return nil
	default:
		return fmt.Errorf("deleting CSIStorageCapacity %s (%s): %w", c.Name, why, err)
	}
}

func (w *Writer) count(op string, err error) {
	r := resultSuccess
	switch {
	case err == nil:
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err):
		r = resultConflict
	default:
		r = resultError
	}
	w.writes.WithLabelValues(op, r).Inc()
}
