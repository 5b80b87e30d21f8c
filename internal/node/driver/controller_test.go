package driver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/marks"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/node/volumelock"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

const (
	mib      = int64(1) << 20
	gib      = int64(1) << 30
	testNode = "node-a"
)

type controllerFixture struct {
	lvm    *provisiontest.LVM
	copier *provisiontest.Copier
	eraser *provisiontest.Eraser
	cfg    *deviceclass.Config
	view   *vgview.View
	cs     *ControllerServer
	// locks are the controller's per-volume locks; they outlive restarts.
	locks *volumelock.Locks
	// marks outlive restarts, as the plugin's state directory does.
	marks *marks.Marks
}

// openMarks is a fresh directory of unfinished-volume marks.
func openMarks(t *testing.T) *marks.Marks {
	t.Helper()
	m, err := marks.Open(filepath.Join(t.TempDir(), "unfinished"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// newControllerFixture: vg1 of 10 GiB holding a 4 GiB thin pool (6 GiB
// free, 5 GiB after the spare of class fast), vg2 of 2 GiB.
func newControllerFixture(t *testing.T) *controllerFixture {
	t.Helper()
	f := provisiontest.NewLVM()
	f.AddVG("vg1", 10<<30)
	f.AddThinPool("vg1", "pool", 4<<30)
	f.AddVG("vg2", 2<<30)
	cfg, err := deviceclass.Parse([]byte(provisiontest.Classes))
	if err != nil {
		t.Fatal(err)
	}
	fx := &controllerFixture{lvm: f, cfg: cfg, eraser: &provisiontest.Eraser{}}
	fx.restart(t)
	return fx
}

// restart builds a new view and controller over the same LVM, as a plugin
// restart does.
func (fx *controllerFixture) restart(t *testing.T) {
	t.Helper()
	fx.view = vgview.New(fx.lvm, fx.cfg, nil)
	if err := fx.view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fx.copier == nil {
		fx.copier = &provisiontest.Copier{}
	}
	if fx.marks == nil {
		fx.marks = openMarks(t)
	}
	if fx.locks == nil {
		fx.locks = volumelock.New()
	}
	fx.cs = NewControllerServer(ControllerConfig{Config: provision.Config{NodeName: testNode, Classes: fx.cfg, LVM: fx.lvm,
		View: fx.view, Eraser: fx.eraser, Copier: fx.copier, Marks: fx.marks,
		Locks: fx.locks}, FSTypes: []string{"ext4", "xfs"}})
}

func mountCap(fsType string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
}

var sw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

func createReq(name string, required int64, params map[string]string) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: required},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("", sw)},
		Parameters:         params,
	}
}

func segment(node string) *csi.Topology {
	return &csi.Topology{Segments: map[string]string{topology.Key: node}}
}

// TestCreateVolume: CreateVolume checks the request (name, capabilities,
// content source, parameters, class, topology) and answers the volume's
// ID, size, topology and context; the sizes and room Create decides are
// provision's TestCreate.
func TestCreateVolume(t *testing.T) {
	thin := map[string]string{volume.ParamDeviceClass: "thin"}
	tests := []struct {
		name     string
		mod      func(r *csi.CreateVolumeRequest)
		code     codes.Code
		msg      []string
		wantSize int64
		wantVG   string
	}{
		{name: "default class, 1 GiB", code: codes.OK, wantSize: gib, wantVG: "vg1"},
		{name: "no name", mod: func(r *csi.CreateVolumeRequest) { r.Name = "" }, code: codes.InvalidArgument, msg: []string{"name"}},
		{name: "name too long", mod: func(r *csi.CreateVolumeRequest) { r.Name = strings.Repeat("x", 501) }, code: codes.InvalidArgument, msg: []string{"at most 500"}},
		{name: "no capabilities", mod: func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = nil }, code: codes.InvalidArgument, msg: []string{"volume_capabilities"}},
		{name: "multi-node mode", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap("", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}
		}, code: codes.InvalidArgument, msg: []string{"MULTI_NODE_MULTI_WRITER", "SINGLE_NODE_WRITER"}},
		{name: "multi-node reader", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = append(r.VolumeCapabilities, blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY))
		}, code: codes.InvalidArgument, msg: []string{"volume_capabilities[1]"}},
		{name: "no access type", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{{AccessMode: &csi.VolumeCapability_AccessMode{Mode: sw}}}
		}, code: codes.InvalidArgument, msg: []string{"block or mount"}},
		{name: "single-node multi-writer block", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER)}
		}, code: codes.OK, wantSize: gib, wantVG: "vg1"},
		{name: "xfs", mod: func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = []*csi.VolumeCapability{mountCap("xfs", sw)} }, code: codes.OK, wantSize: gib, wantVG: "vg1"},
		{name: "btrfs without its tools", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap("btrfs", sw)}
		}, code: codes.ResourceExhausted, msg: []string{`"btrfs"`, "mkfs.btrfs is not installed", "ext4, xfs"}},
		{name: "conflicting fs types", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = []*csi.VolumeCapability{mountCap("xfs", sw), mountCap("ext4", sw)}
		}, code: codes.InvalidArgument, msg: []string{"conflicts"}},
		{name: "content source not carve's", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "s"}}}
		}, code: codes.NotFound, msg: []string{`"s"`}},
		{name: "content source empty", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{}
		}, code: codes.InvalidArgument, msg: []string{"volume_content_source"}},
		{name: "content source without an ID", mod: func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{}}}
		}, code: codes.InvalidArgument, msg: []string{"volume_content_source.volume.volume_id"}},
		{name: "unknown parameter", mod: func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{"fsType": "ext4"} }, code: codes.InvalidArgument, msg: []string{`"fsType"`, volume.ParamDeviceClass, "csi.storage.k8s.io/"}},
		{name: "provisioner parameters pass", mod: func(r *csi.CreateVolumeRequest) {
			r.Parameters = map[string]string{"csi.storage.k8s.io/pvc/name": "data", "csi.storage.k8s.io/pv/name": "pv-1"}
		}, code: codes.OK, wantSize: gib, wantVG: "vg1"},
		{name: "class not on this node", mod: func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{volume.ParamDeviceClass: "gold"} }, code: codes.ResourceExhausted, msg: []string{`"gold"`, "fast, thin, other"}},
		{name: "malformed class", mod: func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{volume.ParamDeviceClass: "Gold!"} }, code: codes.InvalidArgument, msg: []string{"DNS-1123"}},
		{name: "other class", mod: func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{volume.ParamDeviceClass: "other"} }, code: codes.OK, wantSize: gib, wantVG: "vg2"},
		{name: "requisite is this node", mod: func(r *csi.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{segment(testNode)}, Preferred: []*csi.Topology{segment(testNode)}}
		}, code: codes.OK, wantSize: gib, wantVG: "vg1"},
		{name: "requisite is another node", mod: func(r *csi.CreateVolumeRequest) {
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{segment("node-b")}}
		}, code: codes.ResourceExhausted, msg: []string{"node-a"}},
		{name: "thin", mod: func(r *csi.CreateVolumeRequest) { r.Parameters = thin }, code: codes.OK, wantSize: gib, wantVG: "vg1"},
		// The capacity range reaches Create as asked (the sizes it makes
		// are provision's TestCreate).
		{name: "required above limit", mod: func(r *csi.CreateVolumeRequest) {
			r.CapacityRange = &csi.CapacityRange{RequiredBytes: 2 * gib, LimitBytes: gib}
		}, code: codes.InvalidArgument, msg: []string{"exceeds limit_bytes"}},
		{name: "only a small limit", mod: func(r *csi.CreateVolumeRequest) { r.CapacityRange = &csi.CapacityRange{LimitBytes: 100*mib + 1} }, code: codes.OK, wantSize: 100 * mib, wantVG: "vg1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newControllerFixture(t)
			req := createReq("pvc-1", gib, nil)
			if tt.mod != nil {
				tt.mod(req)
			}
			resp, err := fx.cs.CreateVolume(context.Background(), req)
			csitest.WantCode(t, err, tt.code, tt.msg...)
			if tt.code != codes.OK {
				if n := len(fx.view.Volumes()); n != 0 {
					t.Errorf("a failed CreateVolume left %d volumes", n)
				}
				return
			}
			v := resp.GetVolume()
			vg, lvName, err := volume.ParseVolumeID(v.GetVolumeId())
			if err != nil || vg != tt.wantVG || lvName != volume.LVNameFor(req.GetName()) {
				t.Errorf("volume ID %q: vg %q lv %q err %v", v.GetVolumeId(), vg, lvName, err)
			}
			if v.GetCapacityBytes() != tt.wantSize {
				t.Errorf("capacity = %d, want %d", v.GetCapacityBytes(), tt.wantSize)
			}
			if len(v.GetAccessibleTopology()) != 1 || v.GetAccessibleTopology()[0].GetSegments()[topology.Key] != testNode {
				t.Errorf("accessible topology = %v", v.GetAccessibleTopology())
			}
			lv, err := fx.lvm.GetLV(context.Background(), vg, lvName)
			if err != nil {
				t.Fatalf("the LV is not in LVM: %v", err)
			}
			class, _ := volume.ClassFromTags(lv.Tags)
			name, whole, _ := volume.VolumeNameFromTags(lv.Tags)
			if name != req.GetName() || !whole || class != v.GetVolumeContext()[volume.ParamDeviceClass] || !volume.IsCarve(lv.Tags) ||
				v.GetVolumeContext()[volume.ContextVolumeName] != req.GetName() {
				t.Errorf("tags %v; volume context %v", lv.Tags, v.GetVolumeContext())
			}
			if (class == "thin") != (lv.Pool == "pool") {
				t.Errorf("class %s made an LV in pool %q", class, lv.Pool)
			}
		})
	}
}

func TestCreateVolumeLVMErrors(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code codes.Code
	}{
		{"space ran out", fmt.Errorf("vg1: %w", lvm.ErrInsufficientSpace), codes.ResourceExhausted},
		{"bad argument", fmt.Errorf("name: %w", lvm.ErrInvalidArgument), codes.InvalidArgument},
		{"deadline", fmt.Errorf("lvcreate: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"unclassified", errors.New("lvm crashed"), codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newControllerFixture(t)
			fx.lvm.FailNext = tt.err
			_, err := fx.cs.CreateVolume(context.Background(), createReq("pvc-1", gib, nil))
			csitest.WantCode(t, err, tt.code, tt.err.Error())
		})
	}
}

// TestDeleteVolume: DeleteVolume checks the ID (an ID not carve's is
// success, with nothing to do) and hands the rest to Delete, whose
// answers are provision's TestDelete.
func TestDeleteVolume(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		setup func(t *testing.T, fx *controllerFixture) string // returns the ID
		code  codes.Code
		msg   []string
		gone  bool // the LV must be gone afterwards
	}{
		{name: "existing", setup: func(t *testing.T, fx *controllerFixture) string { return mustCreate(t, fx, "pvc-1", nil) }, code: codes.OK, gone: true},
		{name: "empty ID", setup: func(*testing.T, *controllerFixture) string { return "" }, code: codes.InvalidArgument, msg: []string{"volume_id"}},
		{name: "not a carve ID", setup: func(*testing.T, *controllerFixture) string { return "fake-vol-id" }, code: codes.OK},
		{name: "carve form, bad VG name", setup: func(*testing.T, *controllerFixture) string { return "-vg/carve-00" }, code: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newControllerFixture(t)
			id := tt.setup(t, fx)
			_, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: map[string]string{"k": "v"}})
			csitest.WantCode(t, err, tt.code, tt.msg...)
			if !tt.gone {
				return
			}
			vg, lvName, _ := volume.ParseVolumeID(id)
			if _, err := fx.lvm.GetLV(ctx, vg, lvName); !errors.Is(err, lvm.ErrNotFound) {
				t.Errorf("LV still there: %v", err)
			}
		})
	}
}

func mustCreate(t *testing.T, fx *controllerFixture, name string, params map[string]string) string {
	t.Helper()
	resp, err := fx.cs.CreateVolume(context.Background(), createReq(name, gib, params))
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

func TestGetCapacity(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	reportsBefore := fx.lvm.Reports
	tests := []struct {
		name    string
		req     *csi.GetCapacityRequest
		code    codes.Code
		avail   int64
		maxSize int64
	}{
		{"no parameters: default class", &csi.GetCapacityRequest{}, codes.OK, 5 * gib, 5 * gib},
		{"thick class by name", &csi.GetCapacityRequest{Parameters: map[string]string{volume.ParamDeviceClass: "fast"}}, codes.OK, 5 * gib, 5 * gib},
		{"thin class", &csi.GetCapacityRequest{Parameters: map[string]string{volume.ParamDeviceClass: "thin"}}, codes.OK, 8 * gib, 8 * gib},
		{"other VG", &csi.GetCapacityRequest{Parameters: map[string]string{volume.ParamDeviceClass: "other"}}, codes.OK, 2 * gib, 2 * gib},
		{"this node's segment", &csi.GetCapacityRequest{AccessibleTopology: segment(testNode)}, codes.OK, 5 * gib, 5 * gib},
		{"another node's segment", &csi.GetCapacityRequest{AccessibleTopology: segment("node-b")}, codes.OK, 0, 0},
		{"class this node lacks", &csi.GetCapacityRequest{Parameters: map[string]string{volume.ParamDeviceClass: "gold"}}, codes.OK, 0, 0},
		{"provisioner parameters", &csi.GetCapacityRequest{Parameters: map[string]string{"csi.storage.k8s.io/fstype": "xfs"}}, codes.OK, 5 * gib, 5 * gib},
		{"unknown parameter", &csi.GetCapacityRequest{Parameters: map[string]string{"size": "1"}}, codes.InvalidArgument, 0, 0},
		{"supported capability", &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{blockCap(sw)}}, codes.OK, 5 * gib, 5 * gib},
		{"multi-node capability", &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}}, codes.OK, 0, 0},
		{"filesystem without tools", &csi.GetCapacityRequest{VolumeCapabilities: []*csi.VolumeCapability{mountCap("btrfs", sw)}}, codes.OK, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := fx.cs.GetCapacity(ctx, tt.req)
			csitest.WantCode(t, err, tt.code)
			if err != nil {
				return
			}
			if resp.GetAvailableCapacity() != tt.avail || resp.GetMaximumVolumeSize().GetValue() != tt.maxSize || resp.GetMaximumVolumeSize() == nil {
				t.Errorf("available %d max %v; want %d and %d", resp.GetAvailableCapacity(), resp.GetMaximumVolumeSize(), tt.avail, tt.maxSize)
			}
		})
	}
	if fx.lvm.Reports != reportsBefore {
		t.Errorf("GetCapacity ran %d LVM reports; it must answer from the view", fx.lvm.Reports-reportsBefore)
	}

	// Capacity follows mutations without a refresh.
	id := mustCreate(t, fx, "pvc-1", nil)
	resp, err := fx.cs.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || resp.GetAvailableCapacity() != 4*gib {
		t.Errorf("after a 1 GiB create: %v, %v; want 4 GiB", resp.GetAvailableCapacity(), err)
	}
	if _, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	resp, err = fx.cs.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || resp.GetAvailableCapacity() != 5*gib {
		t.Errorf("after delete: %v, %v; want 5 GiB", resp.GetAvailableCapacity(), err)
	}

	// A VG that vanished has no capacity.
	fx.lvm.Mu.Lock()
	delete(fx.lvm.VGs, "vg2")
	fx.lvm.Mu.Unlock()
	if err := fx.view.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err = fx.cs.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{volume.ParamDeviceClass: "other"}})
	if err != nil || resp.GetAvailableCapacity() != 0 {
		t.Errorf("vanished VG: %v, %v; want 0", resp.GetAvailableCapacity(), err)
	}
	_, err = fx.cs.CreateVolume(ctx, createReq("pvc-2", gib, map[string]string{volume.ParamDeviceClass: "other"}))
	csitest.WantCode(t, err, codes.ResourceExhausted, "vg2")
}

func TestListVolumes(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, mustCreate(t, fx, fmt.Sprint("pvc-", i), nil))
	}
	// A foreign LV is not listed.
	if _, err := fx.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: "foreign", Size: 1}); err != nil {
		t.Fatal(err)
	}
	if err := fx.view.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	all, err := fx.cs.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(all.GetEntries()) != 5 || all.GetNextToken() != "" {
		t.Fatalf("ListVolumes = %v, %v", all, err)
	}
	listed := map[string]bool{}
	for _, e := range all.GetEntries() {
		listed[e.GetVolume().GetVolumeId()] = true
		if e.GetVolume().GetCapacityBytes() != gib || e.GetVolume().GetVolumeContext()[volume.ParamDeviceClass] != "fast" {
			t.Errorf("entry %v", e)
		}
	}
	for _, id := range ids {
		if !listed[id] {
			t.Errorf("created volume %s not listed", id)
		}
	}
	// Pages of 2, deleting the last entry of a page before asking for the
	// next one.
	seen := map[string]bool{}
	token := ""
	for pages := 0; ; pages++ {
		page, err := fx.cs.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.GetEntries()) > 2 {
			t.Fatalf("page of %d entries", len(page.GetEntries()))
		}
		for _, e := range page.GetEntries() {
			if seen[e.GetVolume().GetVolumeId()] {
				t.Fatalf("%s listed twice", e.GetVolume().GetVolumeId())
			}
			seen[e.GetVolume().GetVolumeId()] = true
		}
		token = page.GetNextToken()
		if token == "" {
			break
		}
		if _, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: token}); err != nil {
			t.Fatal(err)
		}
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if len(seen) != 5 {
		t.Errorf("saw %d volumes over the pages, want 5", len(seen))
	}
	_, err = fx.cs.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "invalid-token"})
	csitest.WantCode(t, err, codes.Aborted, "starting_token")
	_, err = fx.cs.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: -1})
	csitest.WantCode(t, err, codes.InvalidArgument, "max_entries")
}

func TestControllerGetVolumeAndValidate(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	id := mustCreate(t, fx, "pvc-1", nil)
	if _, err := fx.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: "carve-foreign", Size: 1}); err != nil {
		t.Fatal(err)
	}
	// A carve volume in a volume group the node sees but no class of its
	// uses: another node's, on a shared device-mapper.
	_, name, _ := volume.ParseVolumeID(id)
	own, err := fx.lvm.GetLV(ctx, "vg1", name)
	if err != nil {
		t.Fatal(err)
	}
	fx.lvm.AddVG("vg-other", 1<<30)
	if _, err := fx.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg-other", Name: name, Size: 1, Tags: own.Tags}); err != nil {
		t.Fatal(err)
	}
	// A volume whose data copy has not finished (a restore, a move's
	// target): not made yet, as ListVolumes says.
	copying := volume.LVNameFor("copying")
	if _, err := fx.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: copying, Size: 1,
		Tags: append(slices.Clone(own.Tags), volume.TagCopyPending)}); err != nil {
		t.Fatal(err)
	}
	getTests := []struct {
		name string
		id   string
		code codes.Code
	}{
		{"existing", id, codes.OK},
		{"its copy not finished", volume.VolumeID("vg1", copying), codes.NotFound},
		{"empty", "", codes.InvalidArgument},
		{"not a carve ID", "fake-vol-id", codes.NotFound},
		{"gone", volume.VolumeID("vg1", volume.LVNameFor("never")), codes.NotFound},
		{"not carve's", "vg1/carve-foreign", codes.NotFound},
		{"another node's volume group", volume.VolumeID("vg-other", name), codes.NotFound},
	}
	for _, tt := range getTests {
		t.Run("get/"+tt.name, func(t *testing.T) {
			resp, err := fx.cs.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: tt.id})
			csitest.WantCode(t, err, tt.code)
			if err == nil && (resp.GetVolume().GetVolumeId() != id || resp.GetVolume().GetCapacityBytes() != gib || resp.GetStatus() == nil) {
				t.Errorf("response %v", resp)
			}
		})
	}

	valTests := []struct {
		name      string
		req       *csi.ValidateVolumeCapabilitiesRequest
		code      codes.Code
		confirmed bool
	}{
		{"supported", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap("xfs", sw)}}, codes.OK, true},
		{"block", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)}}, codes.OK, true},
		{"same class", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap("", sw)},
			Parameters: map[string]string{volume.ParamDeviceClass: "fast"}}, codes.OK, true},
		{"other class", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap("", sw)},
			Parameters: map[string]string{volume.ParamDeviceClass: "thin"}}, codes.OK, false},
		{"multi-node", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{mountCap("", csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)}}, codes.OK, false},
		{"no capabilities", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id}, codes.InvalidArgument, false},
		{"no ID", &csi.ValidateVolumeCapabilitiesRequest{VolumeCapabilities: []*csi.VolumeCapability{mountCap("", sw)}}, codes.InvalidArgument, false},
		{"unknown volume", &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "fake-vol-id", VolumeCapabilities: []*csi.VolumeCapability{mountCap("", sw)}}, codes.NotFound, false},
	}
	for _, tt := range valTests {
		t.Run("validate/"+tt.name, func(t *testing.T) {
			resp, err := fx.cs.ValidateVolumeCapabilities(ctx, tt.req)
			csitest.WantCode(t, err, tt.code)
			if err != nil {
				return
			}
			if (resp.GetConfirmed() != nil) != tt.confirmed {
				t.Errorf("confirmed = %v, want %v (message %q)", resp.GetConfirmed(), tt.confirmed, resp.GetMessage())
			}
			if !tt.confirmed && resp.GetMessage() == "" {
				t.Error("an unconfirmed answer without a message")
			}
		})
	}
}

func TestControllerGetCapabilities(t *testing.T) {
	fx := newControllerFixture(t)
	resp, err := fx.cs.ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[csi.ControllerServiceCapability_RPC_Type]bool{}
	for _, c := range resp.GetCapabilities() {
		got[c.GetRpc().GetType()] = true
	}
	for _, want := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES, csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH, csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT, csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	} {
		if !got[want] {
			t.Errorf("capability %v missing", want)
		}
	}
	for _, not := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		if got[not] {
			t.Errorf("capability %v advertised but not implemented", not)
		}
	}
}

// TestListVolumesListsOnlyAvailableVolumes: an LV left half-made by a crash
// (its unfinished mark) and a restore whose copy is under way
// (carve.dev/copy=pending) are no volumes yet: no CreateVolume returned
// them, and the retry finishes or remakes them. ListVolumes and
// ControllerListVolumeHealth (here with the LVs inactive, so unhealthy)
// leave them out; once the mark is gone they are listed.
func TestListVolumesListsOnlyAvailableVolumes(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	done := mustCreate(t, fx, "done", nil)
	var marked []string
	for _, tt := range []struct {
		name string
		tags []string
	}{
		{"half-made", nil}, // marked in the state directory
		{"copying", []string{volume.TagCopyPending}},
	} {
		lv := volume.LVNameFor(tt.name)
		if _, err := fx.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: lv, Size: uint64(gib),
			Tags: append(volume.VolumeTags(tt.name, "fast", nil), tt.tags...)}); err != nil {
			t.Fatal(err)
		}
		if tt.tags == nil {
			if err := fx.marks.Mark("vg1", lv); err != nil {
				t.Fatal(err)
			}
		}
		marked = append(marked, volume.VolumeID("vg1", lv))
	}
	fx.lvm.Mu.Lock()
	for _, id := range append([]string{done}, marked...) {
		fx.lvm.LVs[id].Attr.Active = false
	}
	fx.lvm.Mu.Unlock()
	if err := fx.view.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	listed := func() (vols, unhealthy []string) {
		t.Helper()
		list, err := fx.cs.ListVolumes(ctx, &csi.ListVolumesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.GetEntries() {
			vols = append(vols, e.GetVolume().GetVolumeId())
		}
		health, err := fx.cs.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range health.GetEntries() {
			unhealthy = append(unhealthy, e.GetVolumeId())
		}
		return vols, unhealthy
	}
	if vols, unhealthy := listed(); !slices.Equal(vols, []string{done}) || !slices.Equal(unhealthy, []string{done}) {
		t.Errorf("listed %v, unhealthy %v; want only %s", vols, unhealthy, done)
	}
	// Paging from a marked LV's ID (a token of an older listing) works.
	if page, err := fx.cs.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: marked[0]}); err != nil {
		t.Errorf("ListVolumes from %s: %v", marked[0], err)
	} else {
		for _, e := range page.GetEntries() {
			if slices.Contains(marked, e.GetVolume().GetVolumeId()) {
				t.Errorf("a page lists %s", e.GetVolume().GetVolumeId())
			}
		}
	}
	for _, id := range marked {
		lv := strings.TrimPrefix(id, "vg1/")
		if err := fx.lvm.DeleteTags(ctx, "vg1", lv, volume.TagCopyPending); err != nil {
			t.Fatal(err)
		}
		if err := fx.marks.Clear("vg1", lv); err != nil {
			t.Fatal(err)
		}
	}
	if err := fx.view.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if vols, _ := listed(); len(vols) != 3 {
		t.Errorf("once finished, listed %v; want all three", vols)
	}
}

// TestCreateVolumeRepeatOutsideItsTopology: a repeat of a CreateVolume
// whose requisite topology no longer names this node gets the volume made
// here, not RESOURCE_EXHAUSTED (CSI: idempotent; earlier review finding
// 25); a new volume with that requisite is still refused.
func TestCreateVolumeRepeatOutsideItsTopology(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	first, err := fx.cs.CreateVolume(ctx, createReq("pvc-1", gib, nil))
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := &csi.TopologyRequirement{Requisite: []*csi.Topology{segment("node-b")}}
	again := createReq("pvc-1", gib, nil)
	again.AccessibilityRequirements = elsewhere
	got, err := fx.cs.CreateVolume(ctx, again)
	if err != nil {
		t.Fatalf("the repeat: %v, want the volume made before", err)
	}
	if got.GetVolume().GetVolumeId() != first.GetVolume().GetVolumeId() {
		t.Errorf("the repeat answered volume %q, want %q", got.GetVolume().GetVolumeId(), first.GetVolume().GetVolumeId())
	}
	other := createReq("pvc-2", gib, nil)
	other.AccessibilityRequirements = elsewhere
	_, err = fx.cs.CreateVolume(ctx, other)
	csitest.WantCode(t, err, codes.ResourceExhausted, "requisite topology")
}

// TestListVolumesLeavesOutQuarantinedOrphans: an orphan the audit
// quarantined (renamed carve-orphan-<hex>, volume tags kept) is no volume
// any more: ListVolumes and ControllerListVolumeHealth do not list it
// under its new ID.
func TestListVolumesLeavesOutQuarantinedOrphans(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	done := mustCreate(t, fx, "done", nil)
	orig := volume.LVNameFor("gone")
	qname, _ := volume.QuarantineName(orig)
	if _, err := fx.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: qname, Size: uint64(gib),
		Tags: append(volume.VolumeTags("gone", "fast", nil), volume.OrphanTags(orig, time.Unix(1e9, 0))...)}); err != nil {
		t.Fatal(err)
	}
	fx.lvm.Mu.Lock()
	for _, id := range []string{done, volume.VolumeID("vg1", qname)} {
		fx.lvm.LVs[id].Attr.Active = false // unhealthy, so the health list shows it
	}
	fx.lvm.Mu.Unlock()
	if err := fx.view.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := fx.cs.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var vols []string
	for _, e := range list.GetEntries() {
		vols = append(vols, e.GetVolume().GetVolumeId())
	}
	health, err := fx.cs.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var unhealthy []string
	for _, e := range health.GetEntries() {
		unhealthy = append(unhealthy, e.GetVolumeId())
	}
	if !slices.Equal(vols, []string{done}) || !slices.Equal(unhealthy, []string{done}) {
		t.Errorf("listed %v, unhealthy %v; want only %s, not the quarantined orphan", vols, unhealthy, done)
	}
}
