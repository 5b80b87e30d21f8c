//go:build !nodeagent

package main

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

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
		return audit.InventoryOf(resp)
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
