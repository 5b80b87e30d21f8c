//go:build !nodeagent

package main

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/audit"
	"github.com/carve-csi/carve/internal/node/channel"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/nodeca"
	"github.com/carve-csi/carve/internal/volume"
)

// TestAuditSeesOnlyCarveLVs: the audit's LVs, as the controller reads a
// node agent's inventory, are carve's own in the configured volume groups,
// with their tags read; LVs of other tools and of volume groups carve does
// not use never reach it, and a volume group is readable only once read.
func TestAuditSeesOnlyCarveLVs(t *testing.T) {
	tags := volume.VolumeTags("pvc-1", "fast", map[string]string{
		"csi.storage.k8s.io/pvc/namespace": "db", "csi.storage.k8s.io/pvc/name": "data-0"})
	report := &lvm.Report{
		VolumeGroups: []lvm.VolumeGroup{{Name: "vg1", Size: 10 << 30, Free: 8 << 30, ExtentSize: 4 << 20}, {Name: "other", Size: 1 << 30}},
		LogicalVolumes: []lvm.LogicalVolume{
			{VolumeGroup: "vg1", Name: volume.LVNameFor("pvc-1"), Size: 1 << 30, Tags: tags},
			{VolumeGroup: "vg1", Name: "home", Size: 1 << 30}, // another tool's
			// a snapshot of carve's is no volume
			{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor("snap-1"), Size: 1 << 30, Tags: volume.SnapshotTags("snap-1", "fast", "vg1/x")},
			{VolumeGroup: "vg1", Name: "backup", Size: 1 << 30, Tags: []string{"carve.dev/owner=x"}}, // not carve's tag
			{VolumeGroup: "other", Name: volume.LVNameFor("pvc-2"), Size: 1 << 30, Tags: volume.VolumeTags("pvc-2", "fast", nil)},
		},
	}
	cfg := &deviceclass.Config{DeviceClasses: []deviceclass.DeviceClass{{Name: "fast", VolumeGroup: "vg1"}}}
	view := vgview.New(stubReporter{report}, cfg, nil)
	ca, err := nodeca.NewCA(nodeca.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := channel.New(channel.Config{NodeName: "node-a", TokenFile: filepath.Join(t.TempDir(), "token"),
		Trust: nodeca.NewPool(ca.Cert), Classes: cfg, Capacity: view, Inventory: view})
	if err != nil {
		t.Fatal(err)
	}
	inventory := func() *audit.Inventory {
		resp, err := agent.Inventory(t.Context(), &nodeagentv1.InventoryRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return inventoryOf(resp)
	}
	if inv := inventory(); len(inv.LVs) != 0 || !slices.Equal(inv.Unreadable, []string{"vg1"}) {
		t.Errorf("before the first refresh: %+v, want no LV and vg1 unreadable", inv)
	}
	if err := view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	inv := inventory()
	if len(inv.Unreadable) != 0 || !slices.Equal(inv.Classes, []audit.Class{{Name: "fast", VolumeGroup: "vg1"}}) {
		t.Errorf("after a refresh: unreadable %v, classes %v; want none, fast in vg1", inv.Unreadable, inv.Classes)
	}
	got := inv.LVs
	if len(got) != 1 {
		t.Fatalf("audit LVs %+v, want only carve's in vg1", got)
	}
	want := volume.LVNameFor("pvc-1")
	if l := got[0]; l.Name != want || l.Class != "fast" || l.VolumeName != "pvc-1" || l.Claim != "db/data-0" || l.Size != 1<<30 {
		t.Errorf("audit LV %+v", l)
	}
}

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
	n := auditNodes{fakeAgents{c}}
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
	want := []audit.VolumeHealth{
		{ID: "vg1/carve-a", Problems: []audit.Problem{{Status: "DEGRADED", Reason: "ThinPoolFull", Message: "m-ThinPoolFull"}}},
		{ID: "vg1/carve-b", Problems: []audit.Problem{{Status: "DEGRADED", Reason: "LogicalVolumeDegraded", Message: "m-LogicalVolumeDegraded"}}},
	}
	if err != nil || !reflect.DeepEqual(health, want) {
		t.Errorf("VolumeHealth of node-a (two pages): %+v, %v; want %+v", health, err, want)
	}
	if _, err := n.VolumeHealth(t.Context(), "node-b"); err == nil {
		t.Error("the health of an unreachable node is no error")
	}
}
