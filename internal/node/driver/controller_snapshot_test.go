package driver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

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

func TestCreateSnapshot(t *testing.T) {
	tests := []struct {
		name     string
		params   map[string]string
		wantType lvm.VolumeType
		// wantVGFree is vg1's free space after the snapshot (10 GiB - 4
		// GiB pool, - the 1 GiB thick volume and its copy-on-write space).
		wantVGFree uint64
	}{
		{"thin", thinParams, lvm.TypeThin, 6 << 30},
		// 20% of 1 GiB and 1/128 of that, rounded up to 4 MiB extents:
		// 208 MiB.
		{"thick", nil, lvm.TypeSnapshot, 5<<30 - 208<<20},
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
			lv := fx.lv(t, snap.GetSnapshotId())
			if lv.Attr.Type != tt.wantType || lv.Origin != vol[len("vg1/"):] {
				t.Errorf("snapshot LV %+v: want a %s snapshot of %s", lv, tt.wantType, vol)
			}
			if tt.wantType == lvm.TypeThin && (lv.Attr.Active || !lv.Attr.ActivationSkip) {
				t.Errorf("thin snapshot LV active %v, activation skip %v: want inactive until needed", lv.Attr.Active, lv.Attr.ActivationSkip)
			}
			if free := fx.lvm.VGs["vg1"].Free; free != tt.wantVGFree {
				t.Errorf("vg1 free %d, want %d", free, tt.wantVGFree)
			}

			// Idempotent by name and source; another source is a conflict.
			again := fx.mustSnapshot(t, "snap-1", vol)
			if again.GetSnapshotId() != snap.GetSnapshotId() {
				t.Errorf("repeat gave %s, want %s", again.GetSnapshotId(), snap.GetSnapshotId())
			}
			other := fx.mustVolume(t, "pvc-2", gib, tt.params)
			_, err := fx.cs.CreateSnapshot(ctx, snapReq("snap-1", other))
			wantCode(t, err, codes.AlreadyExists, vol, other)

			// Listed as a snapshot, not as a volume; found by ID and source.
			if vols := fx.view.Volumes(); len(vols) != 2 {
				t.Errorf("ListVolumes sees %d LVs, want the 2 volumes", len(vols))
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

			// After a restart, the snapshot is found from LVM alone.
			fx.restart(t)
			if again := fx.mustSnapshot(t, "snap-1", vol); again.GetSnapshotId() != snap.GetSnapshotId() {
				t.Errorf("after a restart, repeat gave %s", again.GetSnapshotId())
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
			wantCode(t, err, tt.code, tt.msg...)
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

// TestSnapshotRoom: a thin snapshot counts against the overprovision
// ratio (4 GiB pool x 2), a copy-on-write one takes VG space.
func TestSnapshotRoom(t *testing.T) {
	fx := newControllerFixture(t)
	thin := fx.mustVolume(t, "big", 5*gib, thinParams)
	_, err := fx.cs.CreateSnapshot(context.Background(), snapReq("s1", thin))
	wantCode(t, err, codes.ResourceExhausted, "class thin", "snapshot")
	fx.mustVolume(t, "thin-2", 2*gib, thinParams)
	cap2, err := fx.cs.GetCapacity(context.Background(), &csi.GetCapacityRequest{Parameters: thinParams})
	if err != nil || cap2.GetAvailableCapacity() != gib {
		t.Fatalf("thin capacity %v, %v; want 1 GiB", cap2, err)
	}

	thick := fx.mustVolume(t, "thick", 4*gib, nil)
	before, _ := fx.cs.GetCapacity(context.Background(), &csi.GetCapacityRequest{})
	fx.mustSnapshot(t, "s2", thick)
	after, _ := fx.cs.GetCapacity(context.Background(), &csi.GetCapacityRequest{})
	// 20% of 4 GiB and 1/128 of that for metadata, rounded up to
	// extents: 828 MiB.
	if d := before.GetAvailableCapacity() - after.GetAvailableCapacity(); d != 828<<20 {
		t.Errorf("a thick snapshot took %d bytes of capacity, want %d", d, 828<<20)
	}
}

func TestDeleteVolumeWithSnapshots(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	thick := fx.mustVolume(t, "thick", gib, nil)
	snap := fx.mustSnapshot(t, "s-thick", thick)
	_, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: thick})
	wantCode(t, err, codes.FailedPrecondition, snap.GetSnapshotId())
	if _, err := fx.cs.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: thick}); err != nil {
		t.Errorf("DeleteVolume after its snapshot is gone: %v", err)
	}

	// A thin volume's snapshot outlives it, and still names its source.
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
		{"again", snap.GetSnapshotId(), codes.OK, nil},
	}
	for _, tt := range tests {
		_, err := fx.cs.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: tt.id})
		if status := err; tt.code == codes.OK && status != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if tt.code != codes.OK {
			wantCode(t, err, tt.code, tt.msg...)
		}
	}
	if _, err := fx.lvm.GetLV(ctx, "vg1", vol[len("vg1/"):]); err != nil {
		t.Errorf("the volume went with its snapshot: %v", err)
	}
	if n := len(fx.view.Snapshots()); n != 0 {
		t.Errorf("%d snapshots left", n)
	}
}

func TestRestoreAndCloneThin(t *testing.T) {
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
			lv := fx.lv(t, resp.GetVolume().GetVolumeId())
			if lv.Attr.Type != lvm.TypeThin || lv.Origin == "" || lv.Attr.ActivationSkip || lv.Size != tt.wantSize {
				t.Errorf("LV %+v: want a thin snapshot, activation not skipped, of %d bytes", lv, tt.wantSize)
			}
			if len(fx.copier.Copies) != 0 {
				t.Errorf("a thin restore copied: %v", fx.copier.Copies)
			}
			again, err := fx.cs.CreateVolume(ctx, req)
			if err != nil || again.GetVolume().GetVolumeId() != resp.GetVolume().GetVolumeId() {
				t.Errorf("repeat: %v, %v", again, err)
			}
			// The same name from another source is another volume.
			req.VolumeContentSource = fromVolume(fx.mustVolume(t, "pvc-other", gib, thinParams))
			_, err = fx.cs.CreateVolume(ctx, req)
			wantCode(t, err, codes.AlreadyExists, "content source")
			req.VolumeContentSource = nil
			_, err = fx.cs.CreateVolume(ctx, req)
			wantCode(t, err, codes.AlreadyExists, "content source")
		})
	}
}

func TestRestoreSourceRefused(t *testing.T) {
	tests := []struct {
		name   string
		source func(vol, snap string) *csi.VolumeContentSource
		code   codes.Code
		msg    []string
	}{
		{"snapshot of another node", func(_, snap string) *csi.VolumeContentSource {
			return fromSnapshot("node-b" + snap[len(testNode):])
		}, codes.ResourceExhausted, []string{"node-b"}},
		{"snapshot gone", func(string, string) *csi.VolumeContentSource {
			return fromSnapshot(testNode + "/vg1/" + volume.SnapshotLVNameFor("gone"))
		}, codes.NotFound, []string{"does not exist"}},
		{"snapshot ID not carve's", func(string, string) *csi.VolumeContentSource { return fromSnapshot("non-existing-snapshot-id") }, codes.NotFound, nil},
		{"volume gone", func(string, string) *csi.VolumeContentSource { return fromVolume("vg1/" + volume.LVNameFor("gone")) }, codes.NotFound, nil},
		{"a snapshot's ID as a volume", func(_, snap string) *csi.VolumeContentSource {
			return fromVolume(snap[len(testNode)+1:])
		}, codes.NotFound, nil},
		{"limit below the source", func(_, snap string) *csi.VolumeContentSource { return fromSnapshot(snap) }, codes.OutOfRange, []string{"limit_bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newControllerFixture(t)
			vol := fx.mustVolume(t, "pvc-1", 2*gib, thinParams)
			snap := fx.mustSnapshot(t, "snap-1", vol)
			req := createReq("pvc-new", gib, thinParams)
			req.CapacityRange.LimitBytes = gib
			req.VolumeContentSource = tt.source(vol, snap.GetSnapshotId())
			_, err := fx.cs.CreateVolume(context.Background(), req)
			wantCode(t, err, tt.code, tt.msg...)
			if n := len(fx.view.Volumes()); n != 1 {
				t.Errorf("a refused restore left %d volumes, want the source alone", n)
			}
		})
	}
}

// TestFullCOWSnapshot: a copy-on-write snapshot whose space ran out is
// not ready to use, and no restore reads it.
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
	req := createReq("pvc-new", gib, nil)
	req.VolumeContentSource = fromSnapshot(snap.GetSnapshotId())
	_, err = fx.cs.CreateVolume(ctx, req)
	wantCode(t, err, codes.FailedPrecondition, "copy-on-write space")
	if len(fx.copier.Copies) != 0 || slices.ContainsFunc(fx.view.Volumes(), func(l lvm.LogicalVolume) bool { return l.Name == volume.LVNameFor("pvc-new") }) {
		t.Error("a restore from a full COW snapshot made a volume")
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
	wantCode(t, err, codes.Aborted)
	_, err = fx.cs.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: -1})
	wantCode(t, err, codes.InvalidArgument)
}

// TestCloneSourceNotHere: a clone asked on a node that does not hold its
// source volume is NotFound (the controller sends a clone to its source's
// node, or grants a copy from there); nothing is made.
func TestCloneSourceNotHere(t *testing.T) {
	gone := "vg1/" + volume.LVNameFor("gone")
	// Another node's volume group, which this node does not configure.
	foreign := "vg-b/" + volume.LVNameFor("pvc-b")
	for _, source := range []string{gone, foreign} {
		t.Run(source, func(t *testing.T) {
			fx := newControllerFixture(t)
			fx.mustVolume(t, "pvc-1", gib, nil)
			req := createReq("pvc-clone", gib, nil)
			req.VolumeContentSource = fromVolume(source)
			_, err := fx.cs.CreateVolume(context.Background(), req)
			wantCode(t, err, codes.NotFound, "does not exist", "carve controller sends a clone to its source's node")
			if n := len(fx.view.Volumes()); n != 1 {
				t.Errorf("a refused clone left %d volumes, want the first alone", n)
			}
		})
	}
}

// TestSnapshotSizeIsWhatTheClaimAsked: a volume carve made bigger than
// asked (xfs's minimum, whole extents) records the ask; its snapshot
// reports the asked size, so that a restore asked at the source claim's
// size passes csi-provisioner's check, and the restored volume still gets
// the source's whole size. A volume made as asked, or grown since it was
// made, reports its size.
func TestSnapshotSizeIsWhatTheClaimAsked(t *testing.T) {
	tests := []struct {
		name     string
		fs       string
		asked    int64
		params   map[string]string
		grow     int64 // grown to this before the snapshot (0: not)
		made     int64
		reported int64
	}{
		{"xfs minimum, thick", "xfs", 256 * mib, nil, 0, 300 * mib, 256 * mib},
		{"xfs minimum, thin", "xfs", 256 * mib, thinParams, 0, 300 * mib, 256 * mib},
		{"whole extents", "ext4", 101 * mib, nil, 0, 104 * mib, 101 * mib},
		{"as asked", "ext4", 64 * mib, nil, 0, 64 * mib, 64 * mib},
		{"grown since", "xfs", 256 * mib, nil, 512 * mib, 512 * mib, 512 * mib},
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
			if got := int64(fx.lv(t, id).Size); got != tt.made {
				t.Fatalf("volume made %d bytes, want %d", got, tt.made)
			}
			if snap.GetSizeBytes() != tt.reported {
				t.Errorf("snapshot size_bytes %d, want %d", snap.GetSizeBytes(), tt.reported)
			}
			fx.restart(t) // read back from LVM's tags alone
			got, err := fx.cs.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
			if err != nil || got.GetSnapshot().GetSizeBytes() != tt.reported {
				t.Errorf("after a restart GetSnapshot = %v, %v; want size_bytes %d", got, err, tt.reported)
			}
			// Restored at the size the snapshot reports: the source's
			// whole size.
			rreq := createReq("pvc-restored", snap.GetSizeBytes(), tt.params)
			rreq.VolumeCapabilities = []*csi.VolumeCapability{mountCap(tt.fs, sw)}
			rreq.VolumeContentSource = fromSnapshot(snap.GetSnapshotId())
			restored, err := fx.cs.CreateVolume(ctx, rreq)
			if err != nil {
				t.Fatal(err)
			}
			if c := restored.GetVolume().GetCapacityBytes(); c != tt.made {
				t.Errorf("restored volume %d bytes, want the source's %d", c, tt.made)
			}
		})
	}
}
