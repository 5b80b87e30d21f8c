package kubetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// The snapshot API's resources (snapshot.storage.k8s.io/v1), reached
// through a dynamic client: carve has no typed client of its own for them.
var (
	VolumeSnapshotClasses  = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}
	VolumeSnapshots        = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	VolumeSnapshotContents = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

// CreateVolumeSnapshot creates VolumeSnapshot ns/name of claim (in ns)
// with class, with strict field validation.
func CreateVolumeSnapshot(ctx context.Context, dc dynamic.Interface, ns, name, class, claim string) error {
	_, err := dc.Resource(VolumeSnapshots).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"volumeSnapshotClassName": class,
			"source":                  map[string]any{"persistentVolumeClaimName": claim},
		},
	}}, metav1.CreateOptions{FieldValidation: "Strict"})
	if err != nil {
		return fmt.Errorf("create VolumeSnapshot %s/%s: %w", ns, name, err)
	}
	return nil
}

// DeleteSnapshotOptions say how DeleteVolumeSnapshot cleans up.
type DeleteSnapshotOptions struct {
	// DeleteContent deletes the bound VolumeSnapshotContent too (a class
	// with deletionPolicy Retain leaves it behind).
	DeleteContent bool
	// AfterContentDelete, when set, runs once the content is deleted: to
	// lift finalizers that no csi-snapshotter will lift.
	AfterContentDelete func(ctx context.Context, content string) error
	// Wait polls cond until it holds and fails the test after its tier's
	// timeout (the tier's waitFor).
	Wait func(what string, cond func(ctx context.Context) (bool, string, error))
}

// DeleteVolumeSnapshot deletes VolumeSnapshot ns/name and waits until it
// and the content it was bound to are gone. A failed call fails t and the
// cleanup goes on.
func DeleteVolumeSnapshot(t testing.TB, dc dynamic.Interface, ns, name string, o DeleteSnapshotOptions) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var content string
	if vs, err := dc.Resource(VolumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		content, _, _ = unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
	}
	if err := dc.Resource(VolumeSnapshots).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete VolumeSnapshot %s/%s: %v", ns, name, err)
	}
	if content != "" && o.DeleteContent {
		if err := dc.Resource(VolumeSnapshotContents).Delete(ctx, content, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete VolumeSnapshotContent %s: %v", content, err)
		}
		if o.AfterContentDelete != nil {
			if err := o.AfterContentDelete(ctx, content); err != nil {
				t.Errorf("VolumeSnapshotContent %s: %v", content, err)
			}
		}
	}
	o.Wait("the VolumeSnapshot and its content to be deleted", func(ctx context.Context) (bool, string, error) {
		var left []string
		if _, err := dc.Resource(VolumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("VolumeSnapshot %s/%s (%v)", ns, name, err))
		}
		if content != "" {
			if _, err := dc.Resource(VolumeSnapshotContents).Get(ctx, content, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				left = append(left, fmt.Sprintf("VolumeSnapshotContent %s (%v)", content, err))
			}
		}
		return len(left) == 0, fmt.Sprintf("left: %v", left), nil
	})
}

// BoundSnapshotContent is the VolumeSnapshotContent that VolumeSnapshot
// ns/name is bound to, and its name; nil and "" while none is bound yet.
func BoundSnapshotContent(ctx context.Context, dc dynamic.Interface, ns, name string) (*unstructured.Unstructured, string, error) {
	vs, err := dc.Resource(VolumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", err
	}
	content, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
	if content == "" {
		return nil, "", nil
	}
	c, err := dc.Resource(VolumeSnapshotContents).Get(ctx, content, metav1.GetOptions{})
	if err != nil {
		return nil, "", err
	}
	return c, content, nil
}

// DynamicClient is a dynamic client over cfg (for the snapshot API); a
// config it cannot use fails t.
func DynamicClient(t testing.TB, cfg *rest.Config) dynamic.Interface {
	t.Helper()
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dc
}
