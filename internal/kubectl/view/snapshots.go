package view

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/carve-csi/carve/internal/volume"
)

// The snapshot API, through the dynamic client.
var (
	SnapshotResource        = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	SnapshotContentResource = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

// Snapshot is one VolumeSnapshot of carve's driver and the node its ID names.
type Snapshot struct {
	Namespace   string    `json:"namespace"`
	Name        string    `json:"name"`
	SourceClaim string    `json:"sourceClaim,omitempty"`
	Class       string    `json:"class,omitempty"`
	Content     string    `json:"content,omitempty"`
	Node        string    `json:"node"`
	VolumeGroup string    `json:"volumeGroup,omitempty"`
	LV          string    `json:"lv,omitempty"`
	ReadyToUse  bool      `json:"readyToUse"`
	SizeBytes   int64     `json:"restoreSizeBytes,omitempty"`
	Error       string    `json:"error,omitempty"`
	Created     time.Time `json:"created,omitzero"`
}

// Snapshots lists carve's VolumeSnapshots with their node; without rights to list
// contents, those whose source is a carve claim.
func (v View) Snapshots(ctx context.Context) ([]Snapshot, error) {
	if v.Dynamic == nil {
		return nil, fmt.Errorf("no dynamic client for the snapshot API")
	}
	snaps, err := v.Dynamic.Resource(SnapshotResource).Namespace(v.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("listing VolumeSnapshots: %w (are the snapshot CRDs installed?)", err)
		}
		return nil, fmt.Errorf("listing VolumeSnapshots: %w", err)
	}
	contents, err := v.Dynamic.Resource(SnapshotContentResource).List(ctx, metav1.ListOptions{})
	byContent := map[string]*unstructured.Unstructured{}
	var claims map[string]string // without contents: carve's claims and their nodes
	switch {
	case err == nil:
		for i := range contents.Items {
			byContent[contents.Items[i].GetName()] = &contents.Items[i]
		}
	case v.namespacedRights(err):
		v.warn("may not list VolumeSnapshotContents: the node is the source claim's, the volume group and LV are left out")
		if claims, err = v.claimNodes(ctx); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("listing VolumeSnapshotContents: %w", err)
	}

	var out []Snapshot
	for _, s := range snaps.Items {
		row := Snapshot{Namespace: s.GetNamespace(), Name: s.GetName(), Created: s.GetCreationTimestamp().Time}
		row.SourceClaim, _, _ = unstructured.NestedString(s.Object, "spec", "source", "persistentVolumeClaimName")
		row.Class, _, _ = unstructured.NestedString(s.Object, "spec", "volumeSnapshotClassName")
		row.Content, _, _ = unstructured.NestedString(s.Object, "status", "boundVolumeSnapshotContentName")
		row.ReadyToUse, _, _ = unstructured.NestedBool(s.Object, "status", "readyToUse")
		row.Error, _, _ = unstructured.NestedString(s.Object, "status", "error", "message")
		if size, ok, _ := unstructured.NestedString(s.Object, "status", "restoreSize"); ok {
			if q, err := resource.ParseQuantity(size); err == nil {
				row.SizeBytes = q.Value()
			}
		}
		if claims != nil {
			node, ok := claims[row.SourceClaim]
			if !ok {
				continue
			}
			row.Node = node
			out = append(out, row)
			continue
		}
		content := byContent[row.Content]
		if content == nil {
			continue // not bound yet: whose it is, only its class's driver would say
		}
		if drv, _, _ := unstructured.NestedString(content.Object, "spec", "driver"); drv != v.Driver {
			continue
		}
		handle, _, _ := unstructured.NestedString(content.Object, "status", "snapshotHandle")
		if handle == "" {
			handle, _, _ = unstructured.NestedString(content.Object, "spec", "source", "snapshotHandle")
		}
		if node, vg, lv, err := volume.ParseSnapshotID(handle); err == nil {
			row.Node, row.VolumeGroup, row.LV = node, vg, lv
		}
		out = append(out, row)
	}
	sortBy(out, func(r Snapshot) string { return r.Namespace }, func(r Snapshot) string { return r.Name })
	return out, nil
}

// claimNodes maps the namespace's carve claims to their selected node.
func (v View) claimNodes(ctx context.Context) (map[string]string, error) {
	pvcs, err := v.Client.CoreV1().PersistentVolumeClaims(v.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumeClaims: %w", err)
	}
	out := map[string]string{}
	for i := range pvcs.Items {
		if c := &pvcs.Items[i]; v.provisionedBy(c) {
			out[c.Name] = c.Annotations[selectedNodeAnnotation]
		}
	}
	return out, nil
}
