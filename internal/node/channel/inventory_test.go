package channel

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"google.golang.org/protobuf/proto"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/lvmname"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/volume"
)

// TestInventory: carve's volumes with their tags read, nothing else; a
// volume group LVM cannot read is listed as such.
func TestInventory(t *testing.T) {
	// Longer than a tag holds: the tag keeps its head only.
	long := "pvc-" + strings.Repeat("x", lvmname.MaxTagLength)
	lvs := []lvm.LogicalVolume{
		{VolumeGroup: "vg1", Name: volume.LVNameFor("pvc-1"), Size: uint64(gi), Tags: volume.VolumeTags("pvc-1", "thick",
			map[string]string{volume.ParamPVCNamespace: "db", volume.ParamPVCName: "data-0"})},
		{VolumeGroup: "vg1", Name: volume.LVNameFor(long), Size: 2 * uint64(gi), Pool: "pool", Tags: volume.VolumeTags(long, "thin", nil)},
		{VolumeGroup: "vg1", Name: "pool", Size: 4 * uint64(gi), Attr: lvm.Attributes{Type: lvm.TypeThinPool}},
		{VolumeGroup: "vg1", Name: "home", Size: uint64(gi)}, // another tool's
		{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor("snap-1"), Size: uint64(gi), Tags: volume.SnapshotTags("snap-1", "thick", "vg1/x")},
		{VolumeGroup: "other", Name: volume.LVNameFor("pvc-2"), Size: uint64(gi), Tags: volume.VolumeTags("pvc-2", "thick", nil)},
		// A quarantined orphan: reported with the name it had and when.
		{VolumeGroup: "vg1", Name: quarantinedName, Size: uint64(gi),
			Tags: append(volume.VolumeTags("pvc-4", "thick", nil), volume.OrphanTags(volume.LVNameFor("pvc-4"), time.Unix(1_800_000_000, 0))...)},
	}
	classes := &deviceclass.Config{DeviceClasses: []deviceclass.DeviceClass{
		{Name: "thick", VolumeGroup: "vg1"}, {Name: "thin", VolumeGroup: "vg1", ThinPool: "pool"}, {Name: "broken", VolumeGroup: "vg2"},
	}}
	// LVM cannot read vg2.
	lvmState := provisiontest.NewLVM()
	lvmState.SetReport(lvm.Report{
		VolumeGroups:   []lvm.VolumeGroup{{Name: "vg1", Size: 20 * uint64(gi), ExtentSize: ex}, {Name: "other"}, {Name: "vg2"}},
		LogicalVolumes: lvs,
		ThinPools:      []lvm.ThinPool{{Name: "pool", VolumeGroup: "vg1", Size: 4 * uint64(gi)}},
	})
	lvmState.Unreadable = map[string]error{"vg2": errors.New("vg2: checksum error in metadata")}
	view := vgview.New(lvmState, classes, nil)
	e := newEnv(t)
	a, err := New(Config{NodeName: node, TokenFile: e.tokenFile, Trust: e.trust, Classes: classes, Capacity: view, Inventory: view,
		Orphans: &fakeOrphans{busy: []string{volume.LVNameFor("pvc-3")}}})
	if err != nil {
		t.Fatal(err)
	}
	inventory := func() *nodeagentv1.InventoryResponse {
		resp, err := a.Inventory(t.Context(), &nodeagentv1.InventoryRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if got := inventory(); len(got.GetVolumes()) != 0 || len(got.GetUnreadableVolumeGroups()) != 2 {
		t.Errorf("before the first read: %v, want no volume and both volume groups unreadable", got)
	}
	if err := view.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := &nodeagentv1.InventoryResponse{
		Volumes: []*nodeagentv1.LogicalVolume{
			{VolumeGroup: "vg1", Name: volume.LVNameFor("pvc-1"), SizeBytes: gi, DeviceClass: "thick", VolumeName: "pvc-1", Claim: "db/data-0"},
			{VolumeGroup: "vg1", Name: volume.LVNameFor(long), SizeBytes: 2 * gi, DeviceClass: "thin"},
			{VolumeGroup: "vg1", Name: quarantinedName, SizeBytes: gi, DeviceClass: "thick", VolumeName: "pvc-4",
				OrphanOf: volume.LVNameFor("pvc-4"), OrphanedAtUnix: 1_800_000_000},
		},
		UnreadableVolumeGroups: []string{"vg2"},
		DeviceClasses: []*nodeagentv1.DeviceClass{
			{Name: "thick", VolumeGroup: "vg1"}, {Name: "thin", VolumeGroup: "vg1"}, {Name: "broken", VolumeGroup: "vg2"},
		},
		Busy: []string{volume.LVNameFor("pvc-3")},
	}
	// The view lists by vg/name: the order follows the LV names.
	slices.SortFunc(want.Volumes, func(a, b *nodeagentv1.LogicalVolume) int { return strings.Compare(a.GetName(), b.GetName()) })
	if got := inventory(); !proto.Equal(got, want) {
		t.Errorf("inventory\n%v\nwant\n%v", got, want)
	}
}

// quarantinedName is the name of pvc-4's LV in quarantine.
var quarantinedName, _ = volume.QuarantineName(volume.LVNameFor("pvc-4"))

// fakeOrphans holds the busy names and records quarantines and removals.
type fakeOrphans struct {
	busy        []string
	quarantined []string
	removed     []string
	err         error
}

func (f *fakeOrphans) BusyNames() []string { return f.busy }

func (f *fakeOrphans) QuarantineOrphan(_ context.Context, vg, name string, at time.Time) (string, error) {
	if f.err != nil {
		return "", f.err
	}
	f.quarantined = append(f.quarantined, vg+"/"+name+"@"+strconv.FormatInt(at.Unix(), 10))
	q, _ := volume.QuarantineName(name)
	return q, nil
}

func (f *fakeOrphans) RemoveOrphan(_ context.Context, vg, name, orphanOf string) error {
	if f.err != nil {
		return f.err
	}
	f.removed = append(f.removed, vg+"/"+name+"<"+orphanOf)
	return nil
}

// orphanAgent is an agent whose orphans go to orphans; nil is a node
// without a lifecycle, which removes none.
func orphanAgent(t *testing.T, orphans *fakeOrphans) *Agent {
	t.Helper()
	e := newEnv(t)
	cfg := Config{NodeName: node, TokenFile: e.tokenFile, Trust: e.trust, Classes: testClasses(), Capacity: e.view, Inventory: e.view}
	if orphans != nil {
		cfg.Orphans = orphans
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRemoveOrphan: the node's RemoveOrphan, only in a configured volume
// group; its refusal comes back as FAILED_PRECONDITION with the reason.
func TestRemoveOrphan(t *testing.T) {
	tests := []struct {
		name     string
		orphans  *fakeOrphans
		req      *nodeagentv1.RemoveOrphanRequest
		want     codes.Code
		wantMsg  string
		wantGone []string
	}{
		{"removed", &fakeOrphans{}, &nodeagentv1.RemoveOrphanRequest{VolumeGroup: "vg1", Name: "carve-orphan-x", OrphanOf: "carve-x"}, codes.OK, "", []string{"vg1/carve-orphan-x<carve-x"}},
		{"without the name before the quarantine nothing is removed", &fakeOrphans{}, &nodeagentv1.RemoveOrphanRequest{VolumeGroup: "vg1", Name: "carve-x"},
			codes.InvalidArgument, "orphan_of", nil},
		{"a volume group carve does not use", &fakeOrphans{}, &nodeagentv1.RemoveOrphanRequest{VolumeGroup: "root", Name: "home"}, codes.InvalidArgument, "volume_group", nil},
		{"no name", &fakeOrphans{}, &nodeagentv1.RemoveOrphanRequest{VolumeGroup: "vg1"}, codes.InvalidArgument, "name", nil},
		{"refused", &fakeOrphans{err: errors.New("an operation is in flight")}, &nodeagentv1.RemoveOrphanRequest{VolumeGroup: "vg1", Name: "carve-orphan-x", OrphanOf: "carve-x"},
			codes.FailedPrecondition, "in flight", nil},
		{"no lifecycle", nil, &nodeagentv1.RemoveOrphanRequest{VolumeGroup: "vg1", Name: "carve-orphan-x", OrphanOf: "carve-x"}, codes.FailedPrecondition, "removes no orphans", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := orphanAgent(t, tt.orphans).RemoveOrphan(t.Context(), tt.req)
			csitest.WantCode(t, err, tt.want, tt.wantMsg)
			if tt.orphans != nil && !slices.Equal(tt.orphans.removed, tt.wantGone) {
				t.Errorf("removed %v, want %v", tt.orphans.removed, tt.wantGone)
			}
		})
	}
}

// TestQuarantineOrphan: the node's QuarantineOrphan, only in a configured
// volume group and with a time; its refusal comes back as
// FAILED_PRECONDITION with the reason.
func TestQuarantineOrphan(t *testing.T) {
	const at = 1_800_000_000
	tests := []struct {
		name     string
		orphans  *fakeOrphans
		req      *nodeagentv1.QuarantineOrphanRequest
		want     codes.Code
		wantMsg  string
		wantDone []string
	}{
		{"quarantined", &fakeOrphans{}, &nodeagentv1.QuarantineOrphanRequest{VolumeGroup: "vg1", Name: "carve-x", OrphanedAtUnix: at}, codes.OK, "", []string{"vg1/carve-x@1800000000"}},
		{"a volume group carve does not use", &fakeOrphans{}, &nodeagentv1.QuarantineOrphanRequest{VolumeGroup: "root", Name: "home", OrphanedAtUnix: at}, codes.InvalidArgument, "volume_group", nil},
		{"no name", &fakeOrphans{}, &nodeagentv1.QuarantineOrphanRequest{VolumeGroup: "vg1", OrphanedAtUnix: at}, codes.InvalidArgument, "name", nil},
		{"no time", &fakeOrphans{}, &nodeagentv1.QuarantineOrphanRequest{VolumeGroup: "vg1", Name: "carve-x"}, codes.InvalidArgument, "orphaned_at_unix", nil},
		{"refused", &fakeOrphans{err: errors.New("no claim tag")}, &nodeagentv1.QuarantineOrphanRequest{VolumeGroup: "vg1", Name: "carve-x", OrphanedAtUnix: at},
			codes.FailedPrecondition, "no claim tag", nil},
		{"no lifecycle", nil, &nodeagentv1.QuarantineOrphanRequest{VolumeGroup: "vg1", Name: "carve-x", OrphanedAtUnix: at}, codes.FailedPrecondition, "removes no orphans", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := orphanAgent(t, tt.orphans).QuarantineOrphan(t.Context(), tt.req)
			csitest.WantCode(t, err, tt.want, tt.wantMsg)
			if err == nil && resp.GetName() != "carve-orphan-x" {
				t.Errorf("new name %q", resp.GetName())
			}
			if tt.orphans != nil && !slices.Equal(tt.orphans.quarantined, tt.wantDone) {
				t.Errorf("quarantined %v, want %v", tt.orphans.quarantined, tt.wantDone)
			}
		})
	}
}
