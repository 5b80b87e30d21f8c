package audit

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/carve-csi/carve/internal/controller/placement"
)

// DynamicContents finds carve's VolumeSnapshotContents with the dynamic
// client: invalid snapshots are rare, so one list each, no watch.
type DynamicContents struct {
	Dyn    dynamic.Interface
	Driver string
}

var _ SnapshotContents = DynamicContents{}

// ContentOf finds the content of snapshot id; nil when there is none.
func (s DynamicContents) ContentOf(ctx context.Context, id string) (*SnapshotContent, error) {
	list, err := s.Dyn.Resource(placement.VolumeSnapshotContents).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil, nil // no snapshot API in this cluster
	}
	if err != nil {
		return nil, fmt.Errorf("listing VolumeSnapshotContents: %w", err)
	}
	for i := range list.Items {
		o := list.Items[i].Object
		if driver, _, _ := unstructured.NestedString(o, "spec", "driver"); driver != s.Driver {
			continue
		}
		handle, _, _ := unstructured.NestedString(o, "status", "snapshotHandle")
		if handle == "" {
			handle, _, _ = unstructured.NestedString(o, "spec", "source", "snapshotHandle")
		}
		if handle != id {
			continue
		}
		c := &SnapshotContent{Name: list.Items[i].GetName(), UID: list.Items[i].GetUID()}
		ns, _, _ := unstructured.NestedString(o, "spec", "volumeSnapshotRef", "namespace")
		name, _, _ := unstructured.NestedString(o, "spec", "volumeSnapshotRef", "name")
		uid, _, _ := unstructured.NestedString(o, "spec", "volumeSnapshotRef", "uid")
		if ns != "" && name != "" {
			c.Snapshot, c.SnapshotUID = ns+"/"+name, types.UID(uid)
		}
		return c, nil
	}
	return nil, nil
}
