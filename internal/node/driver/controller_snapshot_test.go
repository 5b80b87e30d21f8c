package driver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

var thinParams = map[string]string{volume.ParamDeviceClass: "thin"}

func snapReq(name, source string) *csi.CreateSnapshotRequest {
	return &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source}
}

func fromSnapshot(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func fromVolume(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// mustVolume creates a volume and returns its ID.
func (fx *controllerFixture) mustVolume(t *testing.T, name string, size int64, params map[string]string) string {
	t.Helper()
	resp, err := fx.cs.CreateVolume(context.Background(), createReq(name, size, params))
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

func (fx *controllerFixture) mustSnapshot(t *testing.T, name, source string) *csi.Snapshot {
	t.Helper()
	resp, err := fx.cs.CreateSnapshot(context.Background(), snapReq(name, source))
	if err != nil {
		t.Fatalf("CreateSnapshot %s of %s: %v", name, source, err)
	}
	return resp.GetSnapshot()
}

func (fx *controllerFixture) lv(t *testing.T, id string) *lvm.LogicalVolume {
	t.Helper()
	vg, name, ok := strings.Cut(id, "/")
	if parts := strings.Split(id, "/"); len(parts) == 3 {
		vg, name, ok = parts[1], parts[2], true
	}
	if !ok {
		t.Fatalf("bad ID %q", id)
	}
	lv, err := fx.lvm.GetLV(context.Background(), vg, name)
	if err != nil {
		t.Fatalf("LV of %s: %v", id, err)
	}
	return lv
}

// TestCreateSnapshot: CreateSnapshot answers a ready snapshot of the
// source's size with its node, volume group and creation time, which
// ListSnapshots and GetSnapshot find (what LVs a snapshot makes, and its
// repeats, are provision's TestSnapshot).
func TestCreateSnapshot(t *testing.T) {
	tests := []struct {
		name   string
		params map[string]string
	}{
		{"thin", thinParams},
		{"thick", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			fx := newControllerFixture(t)
			vol := fx.mustVolume(t, "pvc-1", gib, tt.params)
			snap := fx.mustSnapshot(t, "snap-1", vol)
			if !snap.GetReadyToUse() || snap.GetSizeBytes() != gib || snap.GetSourceVolumeId() != vol || snap.GetCreationTime() == nil {
				t.Errorf("snapshot %v: want ready, %d bytes, source %s, a creation time", snap, gib, vol)
			}
			if !strings.HasPrefix(snap.GetSnapshotId(), testNode+"/vg1/") {
				t.Errorf("snapshot ID %s does not name node and volume group", snap.GetSnapshotId())
			}
			if lv := fx.lv(t, snap.GetSnapshotId()); lv.Origin != vol[len("vg1/"):] {
				t.Errorf("snapshot ID %s names LV %+v, not a snapshot of %s", snap.GetSnapshotId(), lv, vol)
			}
			other := fx.mustVolume(t, "pvc-2", gib, tt.params)

			// Listed as a snapshot, not as a volume; found by ID and source.
			if list, err := fx.cs.ListVolumes(ctx, &csi.ListVolumesRequest{}); err != nil || len(list.GetEntries()) != 2 {
				t.Errorf("ListVolumes = %v, %v; want the 2 volumes", list, err)
			}
			for _, req := range []*csi.ListSnapshotsRequest{{}, {SnapshotId: snap.GetSnapshotId()}, {SourceVolumeId: vol}} {
				list, err := fx.cs.ListSnapshots(ctx, req)
				if err != nil || len(list.GetEntries()) != 1 || list.GetEntries()[0].GetSnapshot().GetSnapshotId() != snap.GetSnapshotId() {
					t.Errorf("ListSnapshots(%v) = %v, %v; want the snapshot", req, list, err)
				}
			}
			for _, req := range []*csi.ListSnapshotsRequest{{SnapshotId: "node-a/vg1/carvesnap-00"}, {SourceVolumeId: other}} {
				if list, err := fx.cs.ListSnapshots(ctx, req); err != nil || len(list.GetEntries()) != 0 {
					t.Errorf("ListSnapshots(%v) = %v, %v; want none", req, list, err)
				}
			}
			got, err := fx.cs.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
			if err != nil || got.GetSnapshot().GetSnapshotId() != snap.GetSnapshotId() {
				t.Errorf("GetSnapshot = %v, %v", got, err)
			}
		})
	}
}

func TestCreateSnapshotRefuses(t *testing.T) {
	tests := []struct {
		name string
		req  func(vol string) *csi.CreateSnapshotRequest
		code codes.Code
		msg  []string
	}{
		{"no name", func(vol string) *csi.CreateSnapshotRequest { return snapReq("", vol) }, codes.InvalidArgument, []string{"name"}},
		{"no source", func(string) *csi.CreateSnapshotRequest { return snapReq("s", "") }, codes.InvalidArgument, []string{"source_volume_id"}},
		{"source not carve's", func(string) *csi.CreateSnapshotRequest { return snapReq("s", "x") }, codes.NotFound, []string{`"x"`}},
		{"source gone", func(string) *csi.CreateSnapshotRequest { return snapReq("s", "vg1/"+volume.LVNameFor("gone")) }, codes.NotFound, []string{"does not exist"}},
		{"unknown parameter", func(vol string) *csi.CreateSnapshotRequest {
			r := snapReq("s", vol)
			r.Parameters = map[string]string{"size": "1"}
			return r
		}, codes.InvalidArgument, []string{`"size"`}},
		{"requisite topology elsewhere", func(vol string) *csi.CreateSnapshotRequest {
			r := snapReq("s", vol)
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{segment("node-b")}}
			return r
		}, codes.InvalidArgument, []string{"accessibility_requirements", testNode}},
		{"name too long", func(vol string) *csi.CreateSnapshotRequest { return snapReq(strings.Repeat("n", 501), vol) }, codes.InvalidArgument, []string{"name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newControllerFixture(t)
			vol := fx.mustVolume(t, "pvc-1", gib, thinParams)
			_, err := fx.cs.CreateSnapshot(context.Background(), tt.req(vol))
			csitest.WantCode(t, err, tt.code, tt.msg...)
			if n := len(fx.view.Snapshots()); n != 0 {
				t.Errorf("a refused CreateSnapshot left %d snapshots", n)
			}
		})
	}

	// Snapshot params csi-snapshotter adds pass.
	fx := newControllerFixture(t)
	vol := fx.mustVolume(t, "pvc-1", gib, thinParams)
	r := snapReq("s", vol)
	r.Parameters = map[string]string{"csi.storage.k8s.io/volumesnapshot/name": "snap"}
	if _, err := fx.cs.CreateSnapshot(context.Background(), r); err != nil {
		t.Errorf("snapshot with csi-snapshotter's parameters: %v", err)
	}
}

// TestGetSnapshotOfADeletedVolume: a thin volume's snapshot outlives it,
// and GetSnapshot still names its source from the snapshot's tags (which
// volumes Delete refuses is provision's TestDeleteVolumeWithSnapshots).
func TestGetSnapshotOfADeletedVolume(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	thin := fx.mustVolume(t, "thin", gib, thinParams)
	tsnap := fx.mustSnapshot(t, "s-thin", thin)
	if _, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: thin}); err != nil {
		t.Fatalf("DeleteVolume of a thin volume with a snapshot: %v", err)
	}
	fx.lvm.LVs[tsnap.GetSnapshotId()[len(testNode)+1:]].Origin = "" // LVM forgets the removed origin
	fx.restart(t)
	got, err := fx.cs.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: tsnap.GetSnapshotId()})
	if err != nil || got.GetSnapshot().GetSourceVolumeId() != thin || !got.GetSnapshot().GetReadyToUse() {
		t.Errorf("snapshot after its volume was deleted: %v, %v", got, err)
	}
}

// TestDeleteSnapshot: DeleteSnapshot checks the ID: not carve's, or not
// a snapshot's, is success; another node's is refused (the lifecycle of
// the deletion is provision's TestDeleteSnapshot).
func TestDeleteSnapshot(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	vol := fx.mustVolume(t, "pvc-1", gib, thinParams)
	snap := fx.mustSnapshot(t, "snap-1", vol)
	tests := []struct {
		name string
		id   string
		code codes.Code
		msg  []string
	}{
		{"empty", "", codes.InvalidArgument, []string{"snapshot_id"}},
		{"not carve's", "reallyfakesnapshotid", codes.OK, nil},
		{"other node", "node-b/vg1/" + volume.SnapshotLVNameFor("x"), codes.FailedPrecondition, []string{"node-b"}},
		{"a volume's LV", testNode + "/" + vol, codes.OK, nil}, // not a snapshot ID: nothing to do
		{"the snapshot", snap.GetSnapshotId(), codes.OK, nil},
	}
	for _, tt := range tests {
		_, err := fx.cs.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: tt.id})
		if status := err; tt.code == codes.OK && status != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if tt.code != codes.OK {
			csitest.WantCode(t, err, tt.code, tt.msg...)
		}
	}
	if _, vg, name, _ := volume.ParseSnapshotID(snap.GetSnapshotId()); len(fx.lvm.LVs) != 2 || fx.lvm.LVs[vg+"/"+name] != nil {
		t.Error("DeleteSnapshot left the snapshot")
	}
}

// TestCreateVolumeFromSourceAnswersIt: a restore or clone answers its
// content source and the size made (what it makes, and its repeats, are
// provision's TestRestoreAndCloneThin).
func TestCreateVolumeFromSourceAnswersIt(t *testing.T) {
	tests := []struct {
		name     string
		source   func(vol, snap string) *csi.VolumeContentSource
		size     int64
		wantSize uint64
	}{
		{"restore", func(_, snap string) *csi.VolumeContentSource { return fromSnapshot(snap) }, gib, 1 << 30},
		{"restore bigger", func(_, snap string) *csi.VolumeContentSource { return fromSnapshot(snap) }, 2 * gib, 2 << 30},
		{"restore asked smaller gets the snapshot's size", func(_, snap string) *csi.VolumeContentSource { return fromSnapshot(snap) }, 100 * mib, 1 << 30},
		{"clone", func(vol, _ string) *csi.VolumeContentSource { return fromVolume(vol) }, gib, 1 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			fx := newControllerFixture(t)
			vol := fx.mustVolume(t, "pvc-1", gib, thinParams)
			snap := fx.mustSnapshot(t, "snap-1", vol)
			req := createReq("pvc-new", tt.size, thinParams)
			req.VolumeContentSource = tt.source(vol, snap.GetSnapshotId())
			resp, err := fx.cs.CreateVolume(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetVolume().GetContentSource() == nil || uint64(resp.GetVolume().GetCapacityBytes()) != tt.wantSize {
				t.Errorf("volume %v: want a content source and %d bytes", resp.GetVolume(), tt.wantSize)
			}
			if lv := fx.lv(t, resp.GetVolume().GetVolumeId()); lv.Size != tt.wantSize {
				t.Errorf("volume ID %s names LV %+v, not of %d bytes", resp.GetVolume().GetVolumeId(), lv, tt.wantSize)
			}
		})
	}
}

// TestFullCOWSnapshot: a copy-on-write snapshot whose space ran out is
// not ready to use (that no restore reads it is provision's
// TestRestoreFromFullCOWSnapshot).
func TestFullCOWSnapshot(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	vol := fx.mustVolume(t, "pvc-1", gib, nil)
	snap := fx.mustSnapshot(t, "snap-1", vol)
	lv := fx.lvm.LVs[snap.GetSnapshotId()[len(testNode)+1:]]
	lv.Attr = lvm.ParseAttributes("swi-I-s---")
	lv.SnapPercent = 100
	fx.restart(t)
	got, err := fx.cs.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
	if err != nil || got.GetSnapshot().GetReadyToUse() {
		t.Errorf("GetSnapshot of a full COW snapshot = %v, %v; want not ready", got, err)
	}
	list, _ := fx.cs.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if len(list.GetEntries()) != 1 || list.GetEntries()[0].GetSnapshot().GetReadyToUse() {
		t.Errorf("ListSnapshots = %v; want the snapshot, not ready", list)
	}
}

func TestListSnapshotsPaging(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	vol := fx.mustVolume(t, "pvc-1", gib, thinParams)
	var ids []string
	for _, n := range []string{"a", "b", "c"} {
		ids = append(ids, fx.mustSnapshot(t, n, vol).GetSnapshotId())
	}
	slices.Sort(ids)
	page, err := fx.cs.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: 2})
	if err != nil || len(page.GetEntries()) != 2 || page.GetNextToken() != ids[1] {
		t.Fatalf("first page %v, %v", page, err)
	}
	page, err = fx.cs.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: page.GetNextToken()})
	if err != nil || len(page.GetEntries()) != 1 || page.GetEntries()[0].GetSnapshot().GetSnapshotId() != ids[2] || page.GetNextToken() != "" {
		t.Errorf("second page %v, %v", page, err)
	}
	_, err = fx.cs.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "bogus"})
	csitest.WantCode(t, err, codes.Aborted)
	_, err = fx.cs.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: -1})
	csitest.WantCode(t, err, codes.InvalidArgument)
}

// TestSnapshotAnswersTheAskedSize: CreateSnapshot and GetSnapshot answer
// as size_bytes the size the source's claim asked, which a volume carve
// made bigger (xfs's minimum, whole extents) records, so that a restore
// asked at the source claim's size passes csi-provisioner's check; a
// volume made as asked, or grown since it was made, answers its size
// (the sizes made and restored are provision's
// TestSnapshotSizeIsWhatTheClaimAsked).
func TestSnapshotAnswersTheAskedSize(t *testing.T) {
	tests := []struct {
		name     string
		fs       string
		asked    int64
		params   map[string]string
		grow     int64 // grown to this before the snapshot (0: not)
		reported int64
	}{
		{"xfs minimum, thick", "xfs", 256 * mib, nil, 0, 256 * mib},
		{"xfs minimum, thin", "xfs", 256 * mib, thinParams, 0, 256 * mib},
		{"whole extents", "ext4", 101 * mib, nil, 0, 101 * mib},
		{"as asked", "ext4", 64 * mib, nil, 0, 64 * mib},
		{"grown since", "xfs", 256 * mib, nil, 512 * mib, 512 * mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			fx := newControllerFixture(t)
			req := createReq("pvc-1", tt.asked, tt.params)
			req.VolumeCapabilities = []*csi.VolumeCapability{mountCap(tt.fs, sw)}
			vol, err := fx.cs.CreateVolume(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			id := vol.GetVolume().GetVolumeId()
			if tt.grow > 0 {
				vg, name, _ := volume.ParseVolumeID(id)
				if _, err := fx.lvm.ExtendLV(ctx, vg, name, uint64(tt.grow)); err != nil {
					t.Fatal(err)
				}
				fx.restart(t)
			}
			snap := fx.mustSnapshot(t, "snap-1", id)
			if snap.GetSizeBytes() != tt.reported {
				t.Errorf("snapshot size_bytes %d, want %d", snap.GetSizeBytes(), tt.reported)
			}
			fx.restart(t) // read back from LVM's tags alone
			got, err := fx.cs.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
			if err != nil || got.GetSnapshot().GetSizeBytes() != tt.reported {
				t.Errorf("after a restart GetSnapshot = %v, %v; want size_bytes %d", got, err, tt.reported)
			}
		})
	}
}
