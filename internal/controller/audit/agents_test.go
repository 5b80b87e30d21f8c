package audit

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/paging"
	"github.com/carve-csi/carve/internal/controller/placement"
)

// fakeAgents are node agents reached in memory: node-a's, and no other.
type fakeAgents struct{ a *fakeAgentClient }

func (f fakeAgents) Names() []string { return []string{"node-a"} }

func (f fakeAgents) NodeAgent(_ context.Context, node string) (nodeagentv1.NodeAgentClient, error) {
	if node != "node-a" {
		return nil, errors.New("node " + node + ": no ready node agent endpoint")
	}
	return f.a, nil
}

func (f fakeAgents) Controller(_ context.Context, node string) (csi.ControllerClient, error) {
	if node != "node-a" {
		return nil, errors.New("node " + node + ": no ready node agent endpoint")
	}
	return &fakeHealthClient{}, nil
}

// fakeHealthClient answers ControllerListVolumeHealth with two pages of
// one volume each.
type fakeHealthClient struct {
	csi.ControllerClient
}

func (*fakeHealthClient) ControllerListVolumeHealth(_ context.Context, req *csi.ControllerListVolumeHealthRequest, _ ...grpc.CallOption) (*csi.ControllerListVolumeHealthResponse, error) {
	entry := func(id, reason string) *csi.VolumeHealth {
		return &csi.VolumeHealth{VolumeId: id, HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
			{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: reason, Message: "m-" + reason}}}
	}
	if req.GetStartingToken() == "" {
		return &csi.ControllerListVolumeHealthResponse{Entries: []*csi.VolumeHealth{entry("vg1/carve-a", "ThinPoolFull")}, NextToken: "vg1/carve-a"}, nil
	}
	return &csi.ControllerListVolumeHealthResponse{Entries: []*csi.VolumeHealth{entry("vg1/carve-b", "LogicalVolumeDegraded")}}, nil
}

// fakeAgentClient answers Inventory and records QuarantineOrphan and
// RemoveOrphan.
type fakeAgentClient struct {
	nodeagentv1.NodeAgentClient
	quarantined, removed []string
}

func (f *fakeAgentClient) Inventory(context.Context, *nodeagentv1.InventoryRequest, ...grpc.CallOption) (*nodeagentv1.InventoryResponse, error) {
	return &nodeagentv1.InventoryResponse{Busy: []string{"carve-x"}, UnreadableVolumeGroups: []string{"vg2"},
		Volumes: []*nodeagentv1.LogicalVolume{{VolumeGroup: "vg1", Name: "carve-orphan-q", OrphanOf: "carve-q", OrphanedAtUnix: 1_800_000_000}}}, nil
}

func (f *fakeAgentClient) QuarantineOrphan(_ context.Context, req *nodeagentv1.QuarantineOrphanRequest, _ ...grpc.CallOption) (*nodeagentv1.QuarantineOrphanResponse, error) {
	f.quarantined = append(f.quarantined, req.GetVolumeGroup()+"/"+req.GetName()+"@"+strconv.FormatInt(req.GetOrphanedAtUnix(), 10))
	return &nodeagentv1.QuarantineOrphanResponse{Name: "carve-orphan-y"}, nil
}

func (f *fakeAgentClient) RemoveOrphan(_ context.Context, req *nodeagentv1.RemoveOrphanRequest, _ ...grpc.CallOption) (*nodeagentv1.RemoveOrphanResponse, error) {
	f.removed = append(f.removed, req.GetVolumeGroup()+"/"+req.GetName()+"<"+req.GetOrphanOf())
	return &nodeagentv1.RemoveOrphanResponse{}, nil
}

// TestAuditNodes: the audit reaches a node's agent over the pool, and a
// node the pool cannot reach is an error, not an empty inventory.
func TestAuditNodes(t *testing.T) {
	c := &fakeAgentClient{}
	n := AgentNodes{Pool: fakeAgents{c}}
	inv, err := n.Inventory(t.Context(), "node-a")
	if err != nil || !slices.Equal(inv.Busy, []string{"carve-x"}) || !slices.Equal(inv.Unreadable, []string{"vg2"}) {
		t.Errorf("inventory of node-a: %+v, %v", inv, err)
	}
	if _, err := n.Inventory(t.Context(), "node-b"); err == nil {
		t.Error("the inventory of an unreachable node is no error")
	}
	if len(inv.LVs) != 1 || inv.LVs[0].OrphanOf != "carve-q" || inv.LVs[0].OrphanedAt.Unix() != 1_800_000_000 {
		t.Errorf("quarantined orphan in the inventory: %+v", inv.LVs)
	}
	at := time.Unix(1_800_000_000, 0)
	if got, err := n.QuarantineOrphan(t.Context(), "node-a", "vg1", "carve-y", at); err != nil || got != "carve-orphan-y" ||
		!slices.Equal(c.quarantined, []string{"vg1/carve-y@1800000000"}) {
		t.Errorf("QuarantineOrphan: %q, %v, quarantined %v", got, err, c.quarantined)
	}
	if _, err := n.QuarantineOrphan(t.Context(), "node-b", "vg1", "carve-y", at); err == nil {
		t.Error("a quarantine on an unreachable node is no error")
	}
	if err := n.RemoveOrphan(t.Context(), "node-a", "vg1", "carve-orphan-y", "carve-y"); err != nil || !slices.Equal(c.removed, []string{"vg1/carve-orphan-y<carve-y"}) {
		t.Errorf("RemoveOrphan: %v, removed %v", err, c.removed)
	}
	if err := n.RemoveOrphan(t.Context(), "node-b", "vg1", "carve-orphan-y", "carve-y"); err == nil {
		t.Error("a removal on an unreachable node is no error")
	}
	health, err := n.VolumeHealth(t.Context(), "node-a")
	want := []VolumeHealth{
		{ID: "vg1/carve-a", Problems: []Problem{{Status: "DEGRADED", Reason: "ThinPoolFull", Message: "m-ThinPoolFull"}}},
		{ID: "vg1/carve-b", Problems: []Problem{{Status: "DEGRADED", Reason: "LogicalVolumeDegraded", Message: "m-LogicalVolumeDegraded"}}},
	}
	if err != nil || !reflect.DeepEqual(health, want) {
		t.Errorf("VolumeHealth of node-a (two pages): %+v, %v; want %+v", health, err, want)
	}
	if _, err := n.VolumeHealth(t.Context(), "node-b"); err == nil {
		t.Error("the health of an unreachable node is no error")
	}
}

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
	n := AgentNodes{Pool: fakeAgents{&fakeAgentClient{}}}
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
	s := DynamicContents{Dyn: dyn, Driver: "lvm.carve.dev"}
	for _, tt := range []struct {
		id   string
		want *SnapshotContent
	}{
		{"node-a/vg1/carvesnap-1", &SnapshotContent{Name: "dynamic", UID: "uid-dynamic", Snapshot: "db/snap-dynamic", SnapshotUID: "vs-dynamic"}},
		{"node-a/vg1/carvesnap-2", &SnapshotContent{Name: "static", UID: "uid-static", Snapshot: "db/snap-static", SnapshotUID: "vs-static"}},
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
