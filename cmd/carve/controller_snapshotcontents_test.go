//go:build !nodeagent

package main

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/carve-csi/carve/internal/controller/audit"
	"github.com/carve-csi/carve/internal/controller/paging"
	"github.com/carve-csi/carve/internal/controller/placement"
)

func (*fakeHealthClient) ListSnapshots(_ context.Context, req *csi.ListSnapshotsRequest, _ ...grpc.CallOption) (*csi.ListSnapshotsResponse, error) {
	entry := func(id string, ready bool) *csi.ListSnapshotsResponse_Entry {
		return &csi.ListSnapshotsResponse_Entry{Snapshot: &csi.Snapshot{SnapshotId: id, ReadyToUse: ready}}
	}
	if req.GetStartingToken() == "" {
		return &csi.ListSnapshotsResponse{Entries: []*csi.ListSnapshotsResponse_Entry{entry("node-a/vg1/carvesnap-ok", true), entry("node-a/vg1/carvesnap-lost", false),
			entry("node-b/vg1/carvesnap-forged", false), entry("vg1/carvesnap-no-node", false)},
			NextToken: "node-a/vg1/carvesnap-lost"}, nil
	}
	return &csi.ListSnapshotsResponse{Entries: []*csi.ListSnapshotsResponse_Entry{entry("node-a/vg1/carvesnap-too", false)}}, nil
}

// TestAuditInvalidSnapshots: the audit's invalid snapshots are those the
// node lists not ready, over every page; entries that are not the node's
// own (another node's ID, or no carve ID) are left out.
func TestAuditInvalidSnapshots(t *testing.T) {
	n := auditNodes{fakeAgents{&fakeAgentClient{}}}
	got, err := n.InvalidSnapshots(t.Context(), "node-a")
	if want := []string{"node-a/vg1/carvesnap-lost", "node-a/vg1/carvesnap-too"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("InvalidSnapshots: %v, %v; want %v", got, err, want)
	}
	if _, err := n.InvalidSnapshots(t.Context(), "node-b"); err == nil {
		t.Error("the snapshots of an unreachable node are no error")
	}
}

// TestSnapshotContentOf: the content of a snapshot is carve's
// VolumeSnapshotContent whose handle (status, or spec for a
// pre-provisioned one) is the snapshot's ID, with its VolumeSnapshot.
func TestSnapshotContentOf(t *testing.T) {
	content := func(name, driver, statusHandle, specHandle string) *unstructured.Unstructured {
		o := map[string]any{"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
			"metadata": map[string]any{"name": name, "uid": "uid-" + name},
			"spec":     map[string]any{"driver": driver, "volumeSnapshotRef": map[string]any{"namespace": "db", "name": "snap-" + name, "uid": "vs-" + name}}}
		if statusHandle != "" {
			o["status"] = map[string]any{"snapshotHandle": statusHandle}
		}
		if specHandle != "" {
			o["spec"].(map[string]any)["source"] = map[string]any{"snapshotHandle": specHandle}
		}
		return &unstructured.Unstructured{Object: o}
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{placement.VolumeSnapshotContents: "VolumeSnapshotContentList"},
		content("other", "other.csi.example", "node-a/vg1/carvesnap-1", ""),
		content("dynamic", "lvm.carve.dev", "node-a/vg1/carvesnap-1", ""),
		content("static", "lvm.carve.dev", "", "node-a/vg1/carvesnap-2"))
	s := snapshotContents{dyn: dyn, driver: "lvm.carve.dev"}
	for _, tt := range []struct {
		id   string
		want *audit.SnapshotContent
	}{
		{"node-a/vg1/carvesnap-1", &audit.SnapshotContent{Name: "dynamic", UID: "uid-dynamic", Snapshot: "db/snap-dynamic", SnapshotUID: "vs-dynamic"}},
		{"node-a/vg1/carvesnap-2", &audit.SnapshotContent{Name: "static", UID: "uid-static", Snapshot: "db/snap-static", SnapshotUID: "vs-static"}},
		{"node-a/vg1/carvesnap-3", nil},
	} {
		got, err := s.ContentOf(t.Context(), tt.id)
		if err != nil || (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Errorf("ContentOf(%s) = %+v, %v; want %+v", tt.id, got, err, tt.want)
		}
	}
}

// TestWalkPagesRefusesACycle: a node whose list pages come back to a
// token they handed out before fails its list instead of paging forever.
func TestWalkPagesRefusesACycle(t *testing.T) {
	pages := 0
	err := walkPages(func(token string) (proto.Message, string, int, error) {
		pages++
		return &csi.ListSnapshotsResponse{}, []string{"x", "y"}[pages%2], 0, nil
	})
	if !errors.Is(err, paging.ErrRefused) || pages > 3 {
		t.Errorf("after %d pages: %v, want refused at the third", pages, err)
	}
}
