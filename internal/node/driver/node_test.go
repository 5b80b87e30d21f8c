package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/node/fs/fstest"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/marks"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

// nodeClasses are the node fixture's device classes: fast (thick, vg1,
// 1 GiB spare, its own mkfs options for btrfs) and thin (vg1/pool, ratio 2; the pool exists only where a
// test adds it).
const nodeClasses = `
deviceClasses:
  - name: fast
    volumeGroup: vg1
    default: true
    spare: 1Gi
    mkfsOptions:
      btrfs: ["-O", "quota"]
  - name: thin
    volumeGroup: vg1
    thinPool: pool
    overprovisionRatio: 2
`

// nodeFixture is a Node server over the fake LVM, mount-utils'
// FakeMounter and the fake filesystem tools, with one 1 GiB volume of
// class "fast" in a 10 GiB vg1, wired as the node role wires it: with
// the device classes and a view of the volume groups shared with a
// Controller server.
type nodeFixture struct {
	lvm     *provisiontest.LVM
	mounter *mount.FakeMounter
	tools   *fstest.Tools
	reg     *prometheus.Registry
	ns      *NodeServer
	cs      *ControllerServer
	view    *vgview.View
	// formatting is the node's formatting marks, shared with the
	// controller as the node role shares them.
	formatting *marks.Marks
	// wiped lists the devices whose signature regions were zeroed.
	wiped []string
	// flushed lists the devices flushed, each with the size of the LV
	// of id at the time.
	flushed []flushedAt

	id, device, staging, target string
	// name is the CSI name of the volume id, which its PV's volume
	// context carries; names holds every volume's made here, by ID.
	name  string
	names map[string]string
}

func newNodeFixture(t *testing.T) *nodeFixture {
	t.Helper()
	fx := &nodeFixture{lvm: provisiontest.NewLVM(), mounter: mount.NewFakeMounter(nil), tools: fstest.New(), reg: prometheus.NewRegistry()}
	fx.lvm.AddVG("vg1", 10*uint64(gib))
	fx.name = "pvc-1"
	fx.id, fx.device = fx.addVolume(t, fx.name)
	dir := t.TempDir()
	fx.staging = filepath.Join(dir, "staging", "pv-1")
	fx.target = filepath.Join(dir, "pods", "pod-1", "volumes", "pv-1")
	cfg, err := deviceclass.Parse([]byte(nodeClasses))
	if err != nil {
		t.Fatal(err)
	}
	fx.view = vgview.New(fx.lvm, cfg, nil)
	if err := fx.view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	fx.formatting = openMarks(t)
	fx.cs = NewControllerServer(ControllerConfig{Config: provision.Config{NodeName: testNode, Classes: cfg, LVM: fx.lvm, View: fx.view, Eraser: &provisiontest.Eraser{},
		Marks: openMarks(t), Formatting: fx.formatting}, FSTypes: []string{"ext4", "xfs"}})
	fx.ns = NewNodeServer(NodeConfig{NodeName: testNode, MaxVolumes: 100, LVM: fx.lvm,
		FS: fs.New(fx.mounter, fx.tools), Metrics: metrics.NewRecorder(fx.reg),
		Classes: cfg, View: fx.view, Formatting: fx.formatting, Eraser: signatureWiper{fx}})
	return fx
}

// signatureWiper zeroes signature regions in the fake tools: the device
// then reads as blank. It records flushes (fx.flushed).
type signatureWiper struct{ fx *nodeFixture }

// flushedAt is a flush of the device path while the LV of the fixture's
// volume was lvSize bytes.
type flushedAt struct {
	path   string
	lvSize uint64
}

func (w signatureWiper) Erase(ctx context.Context, path string, m erase.Method) (int64, error) {
	if m == erase.Flush {
		vg, name, err := volume.ParseVolumeID(w.fx.id)
		if err != nil {
			return 0, err
		}
		lv, err := w.fx.lvm.GetLV(ctx, vg, name)
		if err != nil {
			return 0, err
		}
		w.fx.flushed = append(w.fx.flushed, flushedAt{path, lv.Size})
		return 0, nil
	}
	if m != erase.Signatures {
		return 0, fmt.Errorf("the node erased %s with %s; it only zeroes signature regions", path, m)
	}
	w.fx.tools.SetFormat(path, "")
	w.fx.wiped = append(w.fx.wiped, path)
	return 6 << 20, nil
}

// formattingMarked tells whether the volume id carries a formatting mark.
func (fx *nodeFixture) formattingMarked(t *testing.T, id string) bool {
	t.Helper()
	vg, lv, err := volume.ParseVolumeID(id)
	if err != nil {
		t.Fatal(err)
	}
	marked, err := fx.formatting.Has(vg, lv)
	if err != nil {
		t.Fatal(err)
	}
	return marked
}

// addVolume makes a 1 GiB LV of class fast; it returns its ID and device.
func (fx *nodeFixture) addVolume(t *testing.T, name string) (string, string) {
	t.Helper()
	lv, err := fx.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg1", Name: volume.LVNameFor(name),
		Size: uint64(gib), Tags: []string{volume.TagOwner, volume.VolumeTag(name), volume.TagClassPrefix + "fast"}})
	if err != nil {
		t.Fatal(err)
	}
	fx.tools.SetSize(lv.Path, lv.Size)
	fx.named(volume.VolumeID("vg1", lv.Name), name)
	return volume.VolumeID("vg1", lv.Name), lv.Path
}

// addThinVolume makes the thin pool "pool" of 4 GiB in vg1 and in it a
// 1 GiB thin LV of class thin; it returns the LV's ID.
func (fx *nodeFixture) addThinVolume(t *testing.T, name string) string {
	t.Helper()
	fx.lvm.AddThinPool("vg1", "pool", 4*uint64(gib))
	lv, err := fx.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg1", Name: volume.LVNameFor(name),
		Size: uint64(gib), ThinPool: "pool", Tags: []string{volume.TagOwner, volume.VolumeTag(name), volume.TagClassPrefix + "thin"}})
	if err != nil {
		t.Fatal(err)
	}
	fx.named(volume.VolumeID("vg1", lv.Name), name)
	return volume.VolumeID("vg1", lv.Name)
}

// named records that the volume id was made for the CSI name.
func (fx *nodeFixture) named(id, name string) {
	if fx.names == nil {
		fx.names = map[string]string{}
	}
	fx.names[id] = name
}

// setLV changes the fake LV of id.
func (fx *nodeFixture) setLV(id string, change func(*lvm.LogicalVolume)) {
	fx.lvm.Mu.Lock()
	defer fx.lvm.Mu.Unlock()
	change(fx.lvm.LVs[id])
}

func (fx *nodeFixture) stageReq(c *csi.VolumeCapability) *csi.NodeStageVolumeRequest {
	return &csi.NodeStageVolumeRequest{VolumeId: fx.id, StagingTargetPath: fx.staging, VolumeCapability: c,
		VolumeContext: fx.volumeContext(nil)}
}

func (fx *nodeFixture) publishReq(c *csi.VolumeCapability, readOnly bool) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{VolumeId: fx.id, StagingTargetPath: fx.staging, TargetPath: fx.target,
		VolumeCapability: c, Readonly: readOnly, VolumeContext: fx.volumeContext(nil)}
}

// volumeContext is the volume context of fx.id's PV: its name (fx.name
// for an ID no volume here has), and more.
func (fx *nodeFixture) volumeContext(more map[string]string) map[string]string {
	name, ok := fx.names[fx.id]
	if !ok {
		name = fx.name
	}
	vc := map[string]string{volume.ContextVolumeName: name}
	maps.Copy(vc, more)
	return vc
}

func (fx *nodeFixture) stage(t *testing.T, c *csi.VolumeCapability) {
	t.Helper()
	if _, err := fx.ns.NodeStageVolume(context.Background(), fx.stageReq(c)); err != nil {
		t.Fatalf("stage: %v", err)
	}
}

func (fx *nodeFixture) publish(t *testing.T, c *csi.VolumeCapability, readOnly bool) {
	t.Helper()
	if _, err := fx.ns.NodePublishVolume(context.Background(), fx.publishReq(c, readOnly)); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// mountAt returns the fake mount at path, nil when there is none.
func (fx *nodeFixture) mountAt(path string) *mount.MountPoint {
	mps, _ := fx.mounter.List()
	for _, mp := range mps {
		if mp.Path == path {
			return &mp
		}
	}
	return nil
}

// wantGone checks that nothing is mounted at path and that path is removed.
func (fx *nodeFixture) wantGone(t *testing.T, path, what string) {
	t.Helper()
	if fx.mountAt(path) != nil {
		t.Error("still mounted")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s not removed: %v", what, err)
	}
}

// stepCount is how many times a step was recorded with a result.
func (fx *nodeFixture) stepCount(t *testing.T, phase, step, result string) uint64 {
	t.Helper()
	return histogramCount(t, fx.reg, "carve_step_duration_seconds",
		map[string]string{"phase": phase, "step": step, "device_class": "fast", "result": result})
}

// extensionsSeen counts the lvextends of the fixture's volume, each timed
// as a step, and checks that the view holds the LV as they left it
// (View.Extended, which also asks the view for a refresh).
func (fx *nodeFixture) extensionsSeen(t *testing.T) int {
	t.Helper()
	n := int(fx.stepCount(t, metrics.PhaseExpand, metrics.StepLVExtend, "success"))
	vol, err := volume.ParseID(fx.id)
	if err != nil {
		t.Fatal(err)
	}
	lv, err := fx.lvm.GetLV(context.Background(), vol.VG, vol.LV)
	if err != nil {
		t.Fatal(err)
	}
	if seen, ok := fx.view.LV(vol.VG, vol.LV); !ok || seen.Size != lv.Size {
		t.Errorf("the view holds %+v (found %t), LVM %d bytes", seen, ok, lv.Size)
	}
	return n
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metric
				}
			}
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}

// nodeCase is one case of a table-driven test of a Node RPC whose request is
// R; those tests share it and runNodeCases rather than each repeating both.
type nodeCase[R any] struct {
	name    string
	prepare func(t *testing.T, fx *nodeFixture)
	req     func(fx *nodeFixture) R
	code    codes.Code
	msg     []string
	check   func(t *testing.T, fx *nodeFixture)
}

// nodeRPC is what runNodeCases calls for each case and checks afterwards.
type nodeRPC[R any] struct {
	call  func(ctx context.Context, fx *nodeFixture, req R) error
	req   func(fx *nodeFixture) R                             // the request of cases without req
	times int                                                 // calls a case makes, each checked: 2 for idempotence; 0 is once
	after func(t *testing.T, fx *nodeFixture, tc nodeCase[R]) // checks of every case, after its own
}

// callNode makes a NodeServer method expression, such as
// (*NodeServer).NodeStageVolume, a nodeRPC.call on the fixture's server.
func callNode[R, P any](method func(*NodeServer, context.Context, R) (P, error)) func(context.Context, *nodeFixture, R) error {
	return func(ctx context.Context, fx *nodeFixture, req R) error {
		_, err := method(fx.ns, ctx, req)
		return err
	}
}

// runNodeCases runs each case on a fresh fixture: prepare, the call(s) with
// wantCode, then the case's check and rpc.after.
func runNodeCases[R any](t *testing.T, cases []nodeCase[R], rpc nodeRPC[R]) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			if tc.prepare != nil {
				tc.prepare(t, fx)
			}
			newReq := rpc.req
			if tc.req != nil {
				newReq = tc.req
			}
			req := newReq(fx)
			for i := 0; i < max(rpc.times, 1); i++ {
				csitest.WantCode(t, rpc.call(context.Background(), fx, req), tc.code, tc.msg...)
			}
			if tc.check != nil {
				tc.check(t, fx)
			}
			if rpc.after != nil {
				rpc.after(t, fx, tc)
			}
		})
	}
}

var (
	ro   = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	ssw  = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	smw  = csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
	mnmw = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
)

func withFlags(c *csi.VolumeCapability, flags ...string) *csi.VolumeCapability {
	c.GetMount().MountFlags = flags
	return c
}

func TestNodeGetInfoAndCapabilities(t *testing.T) {
	fx := newNodeFixture(t)
	info, err := fx.ns.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetNodeId() != testNode || info.GetMaxVolumesPerNode() != 100 ||
		info.GetAccessibleTopology().GetSegments()[topology.Key] != testNode || len(info.GetAccessibleTopology().GetSegments()) != 1 {
		t.Errorf("NodeGetInfo = %v", info)
	}
	got := csitest.NodeCapabilityTypes(t, fx.ns)
	want := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME, csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH, csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER}
	if !slices.Equal(got, want) {
		t.Errorf("capabilities = %v, want %v", got, want)
	}
}

func TestNodeStageVolume(t *testing.T) {
	cases := []nodeCase[*csi.NodeStageVolumeRequest]{
		{name: "no volume id", code: codes.InvalidArgument, msg: []string{"volume_id"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				r := fx.stageReq(mountCap("", sw))
				r.VolumeId = ""
				return r
			}},
		{name: "no staging path", code: codes.InvalidArgument, msg: []string{"staging_target_path"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				r := fx.stageReq(mountCap("", sw))
				r.StagingTargetPath = ""
				return r
			}},
		{name: "relative staging path", code: codes.InvalidArgument, msg: []string{"staging_target_path", "absolute"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				r := fx.stageReq(mountCap("", sw))
				r.StagingTargetPath = "staging/pv"
				return r
			}},
		{name: "no capability", code: codes.InvalidArgument, msg: []string{"volume_capability is required"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(nil) }},
		{name: "no access type", code: codes.InvalidArgument, msg: []string{"access_type"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				return fx.stageReq(&csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: sw}})
			}},
		{name: "unsupported fs type", code: codes.InvalidArgument, msg: []string{"fs_type", "ntfs", "ext4, xfs, btrfs"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("ntfs", sw)) }},
		{name: "multi-node access mode", code: codes.InvalidArgument, msg: []string{"access_mode", "SINGLE_NODE_WRITER"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("", mnmw)) }},
		{name: "mount flag with a comma", code: codes.InvalidArgument, msg: []string{"mount_flags[1]"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				return fx.stageReq(withFlags(mountCap("", sw), "noatime", "ro,exec"))
			}},
		{name: "bind as a mount flag", code: codes.InvalidArgument, msg: []string{"mount_flags[0]"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				return fx.stageReq(withFlags(mountCap("", sw), "bind"))
			}},
		{name: "mount flag starting with a dash", code: codes.InvalidArgument, msg: []string{"mount_flags[0]"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				return fx.stageReq(withFlags(mountCap("", sw), "--bind"))
			}},
		{name: "id not of carve's form", code: codes.NotFound,
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				r := fx.stageReq(mountCap("", sw))
				r.VolumeId = "some-volume"
				return r
			}},
		{name: "LV does not exist", code: codes.NotFound, msg: []string{"does not exist"},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				r := fx.stageReq(mountCap("", sw))
				r.VolumeId = volume.VolumeID("vg1", volume.LVNameFor("pvc-gone"))
				return r
			}},
		{name: "copy unfinished: refused, not activated", code: codes.FailedPrecondition, msg: []string{"copy"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.setLV(fx.id, func(lv *lvm.LogicalVolume) {
					lv.Attr.Active = false
					lv.Tags = append(lv.Tags, volume.TagCopyPending)
				})
			},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if len(fx.lvm.Activations) != 0 || fx.mountAt(fx.staging) != nil {
					t.Errorf("activations %v, staging mount %v; want neither", fx.lvm.Activations, fx.mountAt(fx.staging))
				}
			}},
		{name: "inactive LV: activated, then staged",
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.setLV(fx.id, func(lv *lvm.LogicalVolume) { lv.Attr.Active = false })
			},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if !slices.Equal(fx.lvm.Activations, []string{fx.id}) || fx.mountAt(fx.staging) == nil {
					t.Errorf("activations %v, staging mount %v; want the volume's LV activated and staged", fx.lvm.Activations, fx.mountAt(fx.staging))
				}
			}},
		{name: "blank device: formatted ext4 and mounted",
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
				return fx.stageReq(withFlags(mountCap("", sw), "noatime"))
			},
			check: func(t *testing.T, fx *nodeFixture) {
				if got := fx.tools.Ran("mkfs.ext4"); len(got) != 1 || got[0][len(got[0])-1] != fx.device {
					t.Errorf("mkfs.ext4 runs: %v", got)
				}
				// One signature read, carve's and mount-utils' both.
				if got := fx.tools.Ran("blkid"); len(got) != 1 {
					t.Errorf("blkid runs: %v, want 1", got)
				}
				mp := fx.mountAt(fx.staging)
				if mp == nil || mp.Device != fx.device || mp.Type != "ext4" || !slices.Contains(mp.Opts, "noatime") {
					t.Errorf("staging mount = %+v", mp)
				}
				for _, step := range []string{metrics.StepSignatureCheck, metrics.StepMkfs, metrics.StepMount} {
					if n := fx.stepCount(t, metrics.PhaseStage, step, "success"); n != 1 {
						t.Errorf("step %s recorded %d times, want 1", step, n)
					}
				}
				if n := histogramCount(t, fx.reg, "carve_phase_duration_seconds",
					map[string]string{"phase": metrics.PhaseStage, "device_class": "fast", "result": "OK"}); n != 1 {
					t.Errorf("stage phase recorded %d times, want 1", n)
				}
			}},
		{name: "blank device: xfs gets nouuid and the default mkfs options",
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("xfs", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				mp := fx.mountAt(fx.staging)
				if len(fx.tools.Ran("mkfs.xfs")) != 1 || mp == nil || mp.Type != "xfs" || !slices.Contains(mp.Opts, "nouuid") {
					t.Errorf("mkfs.xfs runs %v, mount %+v", fx.tools.Ran("mkfs.xfs"), mp)
				}
				want := append(append([]string{"mkfs.xfs"}, fs.DefaultMkfsOptions("xfs")...), "-f", fx.device)
				if got := fx.tools.Ran("mkfs.xfs"); len(got) != 1 || !slices.Equal(got[0], want) {
					t.Errorf("mkfs.xfs runs %q, want %q", got, want)
				}
			}},
		{name: "blank device: btrfs with the class's mkfs options",
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("btrfs", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				want := []string{"mkfs.btrfs", "-O", "quota", fx.device}
				if got := fx.tools.Ran("mkfs.btrfs"); len(got) != 1 || !slices.Equal(got[0], want) || fx.mountAt(fx.staging) == nil {
					t.Errorf("mkfs.btrfs runs %q, want %q", got, want)
				}
			}},
		{name: "device with the filesystem already: never formatted",
			prepare: func(t *testing.T, fx *nodeFixture) { fx.tools.SetFormat(fx.device, "ext4") },
			req:     func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("ext4", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if got := fx.tools.Ran("mkfs.ext4"); len(got) != 0 {
					t.Errorf("a formatted device was formatted again: %v", got)
				}
				if fx.mountAt(fx.staging) == nil {
					t.Error("not mounted")
				}
				if n := fx.stepCount(t, metrics.PhaseStage, metrics.StepMkfs, "success"); n != 0 {
					t.Errorf("mkfs step recorded %d times for a device that was not formatted", n)
				}
			}},
		{name: "device with another filesystem", code: codes.FailedPrecondition, msg: []string{"xfs", "never formats"},
			prepare: func(t *testing.T, fx *nodeFixture) { fx.tools.SetFormat(fx.device, "xfs") },
			req:     func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("ext4", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if len(fx.tools.Ran("mkfs.ext4")) != 0 || fx.mountAt(fx.staging) != nil || fx.tools.Format(fx.device) != "xfs" {
					t.Error("a device holding xfs was touched")
				}
			}},
		{name: "device with a partition table", code: codes.FailedPrecondition, msg: []string{"partitions"},
			prepare: func(t *testing.T, fx *nodeFixture) { fx.tools.SetFormat(fx.device, fstest.PartitionTable) },
			req:     func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("ext4", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if len(fx.tools.Ran("mkfs.ext4")) != 0 {
					t.Error("a partitioned device was formatted")
				}
			}},
		{name: "blkid fails: nothing is formatted", code: codes.Internal,
			prepare: func(t *testing.T, fx *nodeFixture) { fx.tools.Fail("blkid", testingexec.FakeExitError{Status: 4}) },
			req:     func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("ext4", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if len(fx.tools.Ran("mkfs.ext4")) != 0 || fx.mountAt(fx.staging) != nil {
					t.Error("formatted or mounted although the signature check failed")
				}
				if n := fx.stepCount(t, metrics.PhaseStage, metrics.StepSignatureCheck, "error"); n != 1 {
					t.Errorf("failed signature check recorded %d times", n)
				}
			}},
		{name: "mkfs fails", code: codes.Internal, msg: []string{"format"},
			prepare: func(t *testing.T, fx *nodeFixture) { fx.tools.Fail("mkfs.ext4", testingexec.FakeExitError{Status: 1}) },
			req:     func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("ext4", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if fx.mountAt(fx.staging) != nil {
					t.Error("mounted although mkfs failed")
				}
				if fx.stepCount(t, metrics.PhaseStage, metrics.StepMkfs, "error") != 1 ||
					fx.stepCount(t, metrics.PhaseStage, metrics.StepMount, "error")+fx.stepCount(t, metrics.PhaseStage, metrics.StepMount, "success") != 0 {
					t.Error("mkfs failure not recorded as the mkfs step alone")
				}
			}},
		{name: "raw block: nothing to do",
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(blockCap(sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if len(fx.tools.Calls()) != 0 || len(fx.mounter.GetLog()) != 0 {
					t.Errorf("block stage ran %v and mounted %v", fx.tools.Calls(), fx.mounter.GetLog())
				}
			}},
		{name: "already staged: idempotent",
			prepare: func(t *testing.T, fx *nodeFixture) { fx.stage(t, mountCap("", sw)) },
			req:     func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("", sw)) },
			check: func(t *testing.T, fx *nodeFixture) {
				if len(fx.tools.Ran("mkfs.ext4")) != 1 || len(fx.mounter.GetLog()) != 1 {
					t.Errorf("repeated stage formatted %v or mounted %v again", fx.tools.Ran("mkfs.ext4"), fx.mounter.GetLog())
				}
			}},
		{name: "staged with another fs type", code: codes.AlreadyExists, msg: []string{"ext4", "xfs"},
			prepare: func(t *testing.T, fx *nodeFixture) { fx.stage(t, mountCap("", sw)) },
			req:     func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("xfs", sw)) }},
		{name: "another device at the staging path", code: codes.FailedPrecondition, msg: []string{"/dev/other"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				if err := os.MkdirAll(fx.staging, 0o750); err != nil {
					t.Fatal(err)
				}
				fx.mounter.MountPoints = append(fx.mounter.MountPoints, mount.MountPoint{Device: "/dev/other", Path: fx.staging, Type: "ext4"})
			},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("", sw)) }},
		{name: "busy volume", code: codes.Aborted, msg: []string{"in progress"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				if err := fx.ns.acquire(fx.id); err != nil {
					t.Fatal(err)
				}
			},
			req: func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(mountCap("", sw)) }},
	}
	runNodeCases(t, cases, nodeRPC[*csi.NodeStageVolumeRequest]{call: callNode((*NodeServer).NodeStageVolume)})
}

func TestNodeUnstageVolume(t *testing.T) {
	cases := []nodeCase[*csi.NodeUnstageVolumeRequest]{
		{name: "no volume id", code: codes.InvalidArgument, msg: []string{"volume_id"},
			req: func(fx *nodeFixture) *csi.NodeUnstageVolumeRequest {
				return &csi.NodeUnstageVolumeRequest{StagingTargetPath: fx.staging}
			}},
		{name: "no staging path", code: codes.InvalidArgument, msg: []string{"staging_target_path"},
			req: func(fx *nodeFixture) *csi.NodeUnstageVolumeRequest {
				return &csi.NodeUnstageVolumeRequest{VolumeId: fx.id}
			}},
		{name: "staged", prepare: func(t *testing.T, fx *nodeFixture) { fx.stage(t, mountCap("", sw)) }},
		{name: "never staged"},
		{name: "staging path exists but is not mounted", prepare: func(t *testing.T, fx *nodeFixture) {
			if err := os.MkdirAll(fx.staging, 0o750); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "LV deleted meanwhile", prepare: func(t *testing.T, fx *nodeFixture) {
			fx.stage(t, mountCap("", sw))
			if err := fx.lvm.RemoveLV(context.Background(), "vg1", volume.LVNameFor("pvc-1")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	runNodeCases(t, cases, nodeRPC[*csi.NodeUnstageVolumeRequest]{
		call: callNode((*NodeServer).NodeUnstageVolume),
		req: func(fx *nodeFixture) *csi.NodeUnstageVolumeRequest {
			return &csi.NodeUnstageVolumeRequest{VolumeId: fx.id, StagingTargetPath: fx.staging}
		},
		times: 2, // twice: unstaging is idempotent
		after: func(t *testing.T, fx *nodeFixture, tc nodeCase[*csi.NodeUnstageVolumeRequest]) {
			if tc.code == codes.OK {
				fx.wantGone(t, fx.staging, "staging path")
			}
		}})
}

func TestNodePublishVolume(t *testing.T) {
	staged := func(t *testing.T, fx *nodeFixture) { fx.stage(t, mountCap("", sw)) }
	cases := []nodeCase[*csi.NodePublishVolumeRequest]{
		{name: "no volume id", code: codes.InvalidArgument, msg: []string{"volume_id"},
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest {
				r := fx.publishReq(mountCap("", sw), false)
				r.VolumeId = ""
				return r
			}},
		{name: "no target path", code: codes.InvalidArgument, msg: []string{"target_path"},
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest {
				r := fx.publishReq(mountCap("", sw), false)
				r.TargetPath = ""
				return r
			}},
		{name: "no staging path", code: codes.InvalidArgument, msg: []string{"staging_target_path"},
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest {
				r := fx.publishReq(mountCap("", sw), false)
				r.StagingTargetPath = ""
				return r
			}},
		{name: "no capability", code: codes.InvalidArgument, msg: []string{"volume_capability"},
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(nil, false) }},
		{name: "LV does not exist", code: codes.NotFound,
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest {
				r := fx.publishReq(mountCap("", sw), false)
				r.VolumeId = volume.VolumeID("vg1", volume.LVNameFor("pvc-gone"))
				return r
			}},
		{name: "not staged", code: codes.FailedPrecondition, msg: []string{"not staged"},
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(mountCap("", sw), false) }},
		{name: "filesystem: bind mount of the staging path", prepare: staged,
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest {
				return fx.publishReq(withFlags(mountCap("", sw), "noatime"), false)
			},
			check: func(t *testing.T, fx *nodeFixture) {
				mp := fx.mountAt(fx.target)
				if mp == nil || mp.Device != fx.device || !slices.Contains(mp.Opts, "bind") || slices.Contains(mp.Opts, "ro") ||
					!slices.Contains(mp.Opts, "noatime") {
					t.Errorf("target mount = %+v", mp)
				}
				if st, err := os.Stat(fx.target); err != nil || !st.IsDir() {
					t.Errorf("target directory not created: %v", err)
				}
				if fx.stepCount(t, metrics.PhasePublish, metrics.StepBindMount, "success") != 1 {
					t.Error("bind_mount step not recorded")
				}
			}},
		{name: "read-only", prepare: staged,
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(mountCap("", sw), true) },
			check: func(t *testing.T, fx *nodeFixture) {
				if mp := fx.mountAt(fx.target); mp == nil || !slices.Contains(mp.Opts, "ro") {
					t.Errorf("target mount = %+v, want ro", mp)
				}
			}},
		{name: "reader-only access mode is read-only", prepare: staged,
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(mountCap("", ro), false) },
			check: func(t *testing.T, fx *nodeFixture) {
				if mp := fx.mountAt(fx.target); mp == nil || !slices.Contains(mp.Opts, "ro") {
					t.Errorf("target mount = %+v, want ro", mp)
				}
			}},
		{name: "already published: idempotent",
			prepare: func(t *testing.T, fx *nodeFixture) { staged(t, fx); fx.publish(t, mountCap("", sw), false) },
			req:     func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(mountCap("", sw), false) },
			check: func(t *testing.T, fx *nodeFixture) {
				if n := len(fx.mounter.GetLog()); n != 2 {
					t.Errorf("%d mounts, want 2 (stage and one publish)", n)
				}
			}},
		{name: "published read-write, asked read-only", code: codes.AlreadyExists, msg: []string{"read-only"},
			prepare: func(t *testing.T, fx *nodeFixture) { staged(t, fx); fx.publish(t, mountCap("", sw), false) },
			req:     func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(mountCap("", sw), true) }},
		{name: "published as a filesystem, asked block", code: codes.AlreadyExists, msg: []string{"block"},
			prepare: func(t *testing.T, fx *nodeFixture) { staged(t, fx); fx.publish(t, mountCap("", sw), false) },
			req:     func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(blockCap(sw), false) }},
		{name: "another device at the target", code: codes.FailedPrecondition, msg: []string{"/dev/other"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				staged(t, fx)
				if err := os.MkdirAll(fx.target, 0o750); err != nil {
					t.Fatal(err)
				}
				fx.mounter.MountPoints = append(fx.mounter.MountPoints, mount.MountPoint{Device: "/dev/other", Path: fx.target})
			},
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(mountCap("", sw), false) }},
		{name: "single writer already published elsewhere", code: codes.FailedPrecondition, msg: []string{"SINGLE_NODE_SINGLE_WRITER"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.stage(t, mountCap("", ssw))
				fx.publish(t, mountCap("", ssw), false)
				fx.target += "-other"
			},
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(mountCap("", ssw), false) }},
		{name: "multi writer published twice on the node",
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.stage(t, mountCap("", smw))
				fx.publish(t, mountCap("", smw), false)
				fx.target += "-other"
			},
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(mountCap("", smw), false) },
			check: func(t *testing.T, fx *nodeFixture) {
				if fx.mountAt(fx.target) == nil {
					t.Error("second target not mounted")
				}
			}},
		{name: "raw block: the device node onto a file",
			req: func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(blockCap(sw), false) },
			check: func(t *testing.T, fx *nodeFixture) {
				mp := fx.mountAt(fx.target)
				if mp == nil || mp.Device != fx.device || !slices.Contains(mp.Opts, "bind") {
					t.Errorf("target mount = %+v", mp)
				}
				if st, err := os.Stat(fx.target); err != nil || !st.Mode().IsRegular() {
					t.Errorf("target file not created: %v", err)
				}
			}},
		{name: "raw block published again: idempotent",
			prepare: func(t *testing.T, fx *nodeFixture) { fx.publish(t, blockCap(sw), false) },
			req:     func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(blockCap(sw), false) },
			check: func(t *testing.T, fx *nodeFixture) {
				if n := len(fx.mounter.GetLog()); n != 1 {
					t.Errorf("%d mounts, want 1", n)
				}
			}},
	}
	runNodeCases(t, cases, nodeRPC[*csi.NodePublishVolumeRequest]{call: callNode((*NodeServer).NodePublishVolume)})
}

func TestNodeUnpublishVolume(t *testing.T) {
	cases := []nodeCase[*csi.NodeUnpublishVolumeRequest]{
		{name: "no volume id", code: codes.InvalidArgument, msg: []string{"volume_id"},
			req: func(fx *nodeFixture) *csi.NodeUnpublishVolumeRequest {
				return &csi.NodeUnpublishVolumeRequest{TargetPath: fx.target}
			}},
		{name: "no target path", code: codes.InvalidArgument, msg: []string{"target_path"},
			req: func(fx *nodeFixture) *csi.NodeUnpublishVolumeRequest {
				return &csi.NodeUnpublishVolumeRequest{VolumeId: fx.id}
			}},
		{name: "filesystem", prepare: func(t *testing.T, fx *nodeFixture) {
			fx.stage(t, mountCap("", sw))
			fx.publish(t, mountCap("", sw), false)
		}},
		{name: "raw block", prepare: func(t *testing.T, fx *nodeFixture) { fx.publish(t, blockCap(sw), false) }},
		{name: "never published"},
	}
	runNodeCases(t, cases, nodeRPC[*csi.NodeUnpublishVolumeRequest]{
		call: callNode((*NodeServer).NodeUnpublishVolume),
		req: func(fx *nodeFixture) *csi.NodeUnpublishVolumeRequest {
			return &csi.NodeUnpublishVolumeRequest{VolumeId: fx.id, TargetPath: fx.target}
		},
		times: 2, // twice: unpublishing is idempotent
		after: func(t *testing.T, fx *nodeFixture, tc nodeCase[*csi.NodeUnpublishVolumeRequest]) {
			if tc.code != codes.OK {
				return
			}
			fx.wantGone(t, fx.target, "target")
			if fx.mountAt(fx.staging) == nil && tc.name == "filesystem" {
				t.Error("unpublish unmounted the staging path")
			}
		}})
}

func TestNodeGetVolumeStats(t *testing.T) {
	cases := []struct {
		name    string
		prepare func(t *testing.T, fx *nodeFixture)
		req     func(fx *nodeFixture) *csi.NodeGetVolumeStatsRequest
		code    codes.Code
		msg     []string
		check   func(t *testing.T, resp *csi.NodeGetVolumeStatsResponse)
	}{
		{name: "no volume id", code: codes.InvalidArgument, msg: []string{"volume_id"},
			req: func(fx *nodeFixture) *csi.NodeGetVolumeStatsRequest {
				return &csi.NodeGetVolumeStatsRequest{VolumePath: fx.target}
			}},
		{name: "no volume path", code: codes.InvalidArgument, msg: []string{"volume_path"},
			req: func(fx *nodeFixture) *csi.NodeGetVolumeStatsRequest {
				return &csi.NodeGetVolumeStatsRequest{VolumeId: fx.id}
			}},
		{name: "id not of carve's form", code: codes.NotFound,
			req: func(fx *nodeFixture) *csi.NodeGetVolumeStatsRequest {
				return &csi.NodeGetVolumeStatsRequest{VolumeId: "id", VolumePath: "some/path"}
			}},
		{name: "path does not exist", code: codes.NotFound, msg: []string{"does not exist"}},
		{name: "path not mounted", code: codes.NotFound, msg: []string{"nothing is mounted"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				if err := os.MkdirAll(fx.target, 0o750); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "another volume at the path", code: codes.NotFound, msg: []string{"/dev/other"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				if err := os.MkdirAll(fx.target, 0o750); err != nil {
					t.Fatal(err)
				}
				fx.mounter.MountPoints = append(fx.mounter.MountPoints, mount.MountPoint{Device: "/dev/other", Path: fx.target})
			}},
		{name: "filesystem: bytes and inodes",
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.stage(t, mountCap("", sw))
				fx.publish(t, mountCap("", sw), false)
			},
			check: func(t *testing.T, resp *csi.NodeGetVolumeStatsResponse) {
				u := resp.GetUsage()
				if len(u) != 2 || u[0].GetUnit() != csi.VolumeUsage_BYTES || u[1].GetUnit() != csi.VolumeUsage_INODES ||
					u[0].GetTotal() <= 0 || u[1].GetTotal() <= 0 || u[0].GetAvailable() > u[0].GetTotal() ||
					u[1].GetUsed()+u[1].GetAvailable() != u[1].GetTotal() {
					t.Errorf("usage = %v", u)
				}
			}},
		{name: "raw block: device size",
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.publish(t, blockCap(sw), false)
				fx.tools.SetSize(fx.target, uint64(gib))
			},
			check: func(t *testing.T, resp *csi.NodeGetVolumeStatsResponse) {
				u := resp.GetUsage()
				if len(u) != 1 || u[0].GetUnit() != csi.VolumeUsage_BYTES || u[0].GetTotal() != gib {
					t.Errorf("usage = %v", u)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			if tc.prepare != nil {
				tc.prepare(t, fx)
			}
			req := &csi.NodeGetVolumeStatsRequest{VolumeId: fx.id, VolumePath: fx.target}
			if tc.req != nil {
				req = tc.req(fx)
			}
			resp, err := fx.ns.NodeGetVolumeStats(context.Background(), req)
			csitest.WantCode(t, err, tc.code, tc.msg...)
			if tc.check != nil {
				tc.check(t, resp)
			}
		})
	}
}

func TestNodeGetVolumeHealth(t *testing.T) {
	published := func(t *testing.T, fx *nodeFixture) {
		fx.stage(t, mountCap("", sw))
		fx.publish(t, mountCap("", sw), false)
	}
	cases := []struct {
		name    string
		prepare func(t *testing.T, fx *nodeFixture)
		req     func(fx *nodeFixture) *csi.NodeGetVolumeHealthRequest
		code    codes.Code
		msg     []string
		reasons []string
	}{
		{name: "no volume id", code: codes.InvalidArgument, msg: []string{"volume_id"},
			req: func(fx *nodeFixture) *csi.NodeGetVolumeHealthRequest { return &csi.NodeGetVolumeHealthRequest{} }},
		{name: "relative publish path", code: codes.InvalidArgument, msg: []string{"volume_publish_path"},
			req: func(fx *nodeFixture) *csi.NodeGetVolumeHealthRequest {
				return &csi.NodeGetVolumeHealthRequest{VolumeId: fx.id, VolumePublishPath: "some/path"}
			}},
		{name: "unknown volume", code: codes.NotFound,
			req: func(fx *nodeFixture) *csi.NodeGetVolumeHealthRequest {
				return &csi.NodeGetVolumeHealthRequest{VolumeId: volume.VolumeID("vg1", volume.LVNameFor("pvc-gone"))}
			}},
		{name: "healthy, no paths",
			req: func(fx *nodeFixture) *csi.NodeGetVolumeHealthRequest {
				return &csi.NodeGetVolumeHealthRequest{VolumeId: fx.id}
			}},
		{name: "healthy and mounted", prepare: published},
		{name: "inactive LV", reasons: []string{"LogicalVolumeInactive"}, prepare: func(t *testing.T, fx *nodeFixture) {
			published(t, fx)
			fx.setLV(fx.id, func(lv *lvm.LogicalVolume) { lv.Attr.Active = false })
		}},
		{name: "partial LV", reasons: []string{"PhysicalVolumeMissing"}, prepare: func(t *testing.T, fx *nodeFixture) {
			published(t, fx)
			fx.setLV(fx.id, func(lv *lvm.LogicalVolume) { lv.Attr.Health = lvm.HealthPartial })
		}},
		{name: "not mounted at the publish path", reasons: []string{"NotMounted"}, prepare: func(t *testing.T, fx *nodeFixture) {
			fx.stage(t, mountCap("", sw))
		}},
		{name: "staging path unmounted under a published volume", reasons: []string{"NotMounted"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				published(t, fx)
				if err := fx.mounter.Unmount(fx.staging); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "LV removed under a mounted volume", reasons: []string{"LogicalVolumeMissing"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				published(t, fx)
				if err := fx.lvm.RemoveLV(context.Background(), "vg1", volume.LVNameFor("pvc-1")); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "LV removed, nothing mounted", code: codes.NotFound,
			prepare: func(t *testing.T, fx *nodeFixture) {
				if err := fx.lvm.RemoveLV(context.Background(), "vg1", volume.LVNameFor("pvc-1")); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			if tc.prepare != nil {
				tc.prepare(t, fx)
			}
			req := &csi.NodeGetVolumeHealthRequest{VolumeId: fx.id, VolumePublishPath: fx.target, StagingTargetPath: fx.staging}
			if tc.req != nil {
				req = tc.req(fx)
			}
			resp, err := fx.ns.NodeGetVolumeHealth(context.Background(), req)
			csitest.WantCode(t, err, tc.code, tc.msg...)
			if err != nil {
				return
			}
			if resp.GetVolumeHealth().GetVolumeId() != req.GetVolumeId() {
				t.Errorf("volume id %q", resp.GetVolumeHealth().GetVolumeId())
			}
			var reasons []string
			for _, h := range resp.GetVolumeHealth().GetHealthStatuses() {
				reasons = append(reasons, h.GetReason())
			}
			if !slices.Equal(reasons, tc.reasons) {
				t.Errorf("health reasons = %v, want %v", reasons, tc.reasons)
			}
		})
	}
}

func TestNodeExpandVolume(t *testing.T) {
	published := func(fsType string) func(t *testing.T, fx *nodeFixture) {
		return func(t *testing.T, fx *nodeFixture) {
			fx.stage(t, mountCap(fsType, sw))
			fx.publish(t, mountCap(fsType, sw), false)
		}
	}
	expand := func(required, limit int64) func(fx *nodeFixture) *csi.NodeExpandVolumeRequest {
		return func(fx *nodeFixture) *csi.NodeExpandVolumeRequest {
			return &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target, StagingTargetPath: fx.staging,
				CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}}
		}
	}
	cases := []struct {
		name         string
		prepare      func(t *testing.T, fx *nodeFixture)
		req          func(fx *nodeFixture) *csi.NodeExpandVolumeRequest
		code         codes.Code
		msg          []string
		wantCapacity int64
		wantChanges  int
		wantGrow     []string
	}{
		{name: "no volume id", code: codes.InvalidArgument, msg: []string{"volume_id"},
			req: func(fx *nodeFixture) *csi.NodeExpandVolumeRequest {
				return &csi.NodeExpandVolumeRequest{VolumePath: fx.target}
			}},
		{name: "no volume path", code: codes.InvalidArgument, msg: []string{"volume_path"},
			req: func(fx *nodeFixture) *csi.NodeExpandVolumeRequest {
				return &csi.NodeExpandVolumeRequest{VolumeId: fx.id}
			}},
		{name: "required above limit", code: codes.OutOfRange, msg: []string{"limit_bytes"}, req: expand(3*gib, 2*gib)},
		{name: "negative required", code: codes.InvalidArgument, msg: []string{"required_bytes"}, req: expand(-1, 0)},
		{name: "unknown volume", code: codes.NotFound,
			req: func(fx *nodeFixture) *csi.NodeExpandVolumeRequest {
				return &csi.NodeExpandVolumeRequest{VolumeId: "fake-volume-id", VolumePath: "some/path"}
			}},
		{name: "path does not exist", code: codes.NotFound, msg: []string{"does not exist"}, req: expand(2*gib, 0)},
		{name: "filesystem not mounted", code: codes.FailedPrecondition, msg: []string{"not mounted"}, req: expand(2*gib, 0),
			prepare: func(t *testing.T, fx *nodeFixture) {
				if err := os.MkdirAll(fx.target, 0o750); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "ext4: lvextend and resize2fs", prepare: published("ext4"), req: expand(2*gib, 0),
			wantCapacity: 2 * gib, wantChanges: 1, wantGrow: []string{"resize2fs", "/dev/vg1/" + volume.LVNameFor("pvc-1")}},
		{name: "xfs: xfs_growfs on the mount path", prepare: published("xfs"), req: expand(2*gib, 3*gib),
			wantCapacity: 2 * gib, wantChanges: 1, wantGrow: []string{"xfs_growfs", "-d", "TARGET"}},
		{name: "btrfs: resize max", prepare: published("btrfs"), req: expand(2*gib, 0),
			wantCapacity: 2 * gib, wantChanges: 1, wantGrow: []string{"btrfs", "filesystem", "resize", "max", "TARGET"}},
		{name: "rounded up to whole extents", prepare: published("ext4"), req: expand(gib+1, 0),
			wantCapacity: gib + 4*mib, wantChanges: 1, wantGrow: []string{"resize2fs", "/dev/vg1/" + volume.LVNameFor("pvc-1")}},
		{name: "already that size: no lvextend, the filesystem still grows", prepare: published("ext4"), req: expand(gib, 0),
			wantCapacity: gib, wantGrow: []string{"resize2fs", "/dev/vg1/" + volume.LVNameFor("pvc-1")}},
		{name: "larger than the volume group could ever hold", code: codes.OutOfRange, msg: []string{"the most a volume can have on this node"},
			prepare: published("ext4"), req: expand(20*gib, 0)},
		{name: "no room left in the volume group", code: codes.ResourceExhausted, msg: []string{"available", "spare"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				published("ext4")(t, fx)
				if _, err := fx.cs.CreateVolume(context.Background(), createReq("pvc-big", 7*gib+512*mib, nil)); err != nil {
					t.Fatal(err)
				}
			}, req: expand(2*gib, 0)},
		{name: "grow fails", code: codes.Internal, req: expand(2*gib, 0), wantChanges: 1,
			prepare: func(t *testing.T, fx *nodeFixture) {
				published("ext4")(t, fx)
				fx.tools.Fail("resize2fs", testingexec.FakeExitError{Status: 1})
			}},
		{name: "raw block: only lvextend", req: expand(2*gib, 0), wantCapacity: 2 * gib, wantChanges: 1,
			prepare: func(t *testing.T, fx *nodeFixture) { fx.publish(t, blockCap(sw), false) }},
		{name: "block capability on a directory", code: codes.InvalidArgument, msg: []string{"volume_capability"},
			prepare: published("ext4"),
			req: func(fx *nodeFixture) *csi.NodeExpandVolumeRequest {
				r := expand(2*gib, 0)(fx)
				r.VolumeCapability = blockCap(sw)
				return r
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			if tc.prepare != nil {
				tc.prepare(t, fx)
			}
			resp, err := fx.ns.NodeExpandVolume(context.Background(), tc.req(fx))
			csitest.WantCode(t, err, tc.code, tc.msg...)
			if got := fx.extensionsSeen(t); got != tc.wantChanges {
				t.Errorf("the view saw %d lvextends, want %d", got, tc.wantChanges)
			}
			if err != nil {
				return
			}
			if resp.GetCapacityBytes() != tc.wantCapacity {
				t.Errorf("capacity = %d, want %d", resp.GetCapacityBytes(), tc.wantCapacity)
			}
			lv, _ := fx.lvm.GetLV(context.Background(), "vg1", volume.LVNameFor("pvc-1"))
			if int64(lv.Size) != tc.wantCapacity {
				t.Errorf("LV size = %d, want %d", lv.Size, tc.wantCapacity)
			}
			var grows [][]string
			for _, c := range fx.tools.Calls() {
				if c[0] == "resize2fs" || c[0] == "xfs_growfs" || c[0] == "btrfs" {
					grows = append(grows, c)
				}
			}
			want := slices.Clone(tc.wantGrow)
			for i := range want {
				if want[i] == "TARGET" {
					want[i] = fx.target
				}
			}
			switch {
			case want == nil && len(grows) != 0:
				t.Errorf("grew %v, want nothing", grows)
			case want != nil && (len(grows) != 1 || !slices.Equal(grows[0], want)):
				t.Errorf("grew %v, want %v", grows, want)
			}
			if want != nil && fx.stepCount(t, metrics.PhaseExpand, metrics.StepFilesystemGrow, "success") != 1 {
				t.Error("fs_grow step not recorded")
			}
			if tc.wantChanges > 0 && fx.stepCount(t, metrics.PhaseExpand, metrics.StepLVExtend, "success") != 1 {
				t.Error("lvextend step not recorded")
			}
		})
	}
}

// A repeated expansion extends nothing more and reports the same size.
func TestNodeExpandVolumeIdempotent(t *testing.T) {
	fx := newNodeFixture(t)
	fx.stage(t, mountCap("", sw))
	fx.publish(t, mountCap("", sw), false)
	req := &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib}}
	for i := 0; i < 3; i++ {
		resp, err := fx.ns.NodeExpandVolume(context.Background(), req)
		if err != nil || resp.GetCapacityBytes() != 2*gib {
			t.Fatalf("expansion %d: %v, %v", i, resp, err)
		}
	}
	if got := fx.extensionsSeen(t); got != 1 {
		t.Errorf("the view saw %d lvextends, want 1 (one lvextend)", got)
	}
}

// The whole life of a volume on the node, twice over, as after a plugin
// restart: the device is formatted once only.
func TestNodeLifecycleFormatsOnce(t *testing.T) {
	fx := newNodeFixture(t)
	for round := 0; round < 2; round++ {
		fx.ns = NewNodeServer(fx.ns.cfg) // a restarted plugin: no memory
		fx.stage(t, mountCap("xfs", sw))
		fx.publish(t, mountCap("xfs", sw), false)
		if _, err := fx.ns.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: fx.id, TargetPath: fx.target}); err != nil {
			t.Fatal(err)
		}
		if _, err := fx.ns.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: fx.id, StagingTargetPath: fx.staging}); err != nil {
			t.Fatal(err)
		}
	}
	if got := fx.tools.Ran("mkfs.xfs"); len(got) != 1 {
		t.Errorf("mkfs ran %d times over two stagings, want 1", len(got))
	}
	if len(fx.mounter.MountPoints) != 0 {
		t.Errorf("mounts left: %v", fx.mounter.MountPoints)
	}
	for _, phase := range []string{metrics.PhaseStage, metrics.PhasePublish, metrics.PhaseUnpublish, metrics.PhaseUnstage} {
		if n := histogramCount(t, fx.reg, "carve_phase_duration_seconds",
			map[string]string{"phase": phase, "device_class": "fast", "result": "OK"}); n != 2 {
			t.Errorf("phase %s recorded %d times with class fast, want 2", phase, n)
		}
	}
}

// TestNodeStageGrowsExistingFilesystem: a device that already holds the
// filesystem (a restored or cloned volume, bigger than its source) has it
// grown to the device at stage, never formatted; a blank device is
// formatted and not grown.
func TestNodeStageGrowsExistingFilesystem(t *testing.T) {
	tests := []struct {
		name, existing, fsType string
		wantGrow               []string
		wantMkfs               bool
	}{
		{"ext4", "ext4", "ext4", []string{"resize2fs", "DEVICE"}, false},
		{"xfs", "xfs", "xfs", []string{"xfs_growfs", "-d", "STAGING"}, false},
		{"blank", "", "ext4", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			if tt.existing != "" {
				fx.tools.SetFormat(fx.device, tt.existing)
			}
			fx.stage(t, mountCap(tt.fsType, sw))
			var grows [][]string
			mkfs := false
			for _, c := range fx.tools.Calls() {
				switch {
				case c[0] == "resize2fs" || c[0] == "xfs_growfs":
					grows = append(grows, c)
				case strings.HasPrefix(c[0], "mkfs"):
					mkfs = true
				}
			}
			if mkfs != tt.wantMkfs {
				t.Errorf("mkfs ran: %v, want %v", mkfs, tt.wantMkfs)
			}
			want := slices.Clone(tt.wantGrow)
			for i := range want {
				want[i] = strings.NewReplacer("DEVICE", fx.device, "STAGING", fx.staging).Replace(want[i])
			}
			if tt.wantGrow == nil && len(grows) != 0 || tt.wantGrow != nil && (len(grows) != 1 || !slices.Equal(grows[0], want)) {
				t.Errorf("grew with %q, want %q", grows, want)
			}
			if got := fx.stepCount(t, metrics.PhaseStage, metrics.StepFilesystemGrow, "success"); (got == 1) != (tt.wantGrow != nil) {
				t.Errorf("%d fs_grow steps recorded", got)
			}
		})
	}
}

// listFails is a mounter whose mount table cannot be read.
type listFails struct{ *mount.FakeMounter }

func (listFails) List() ([]mount.MountPoint, error) {
	return nil, errors.New("reading /proc/self/mountinfo: too many open files")
}

// TestNodeGetVolumeHealthMountTableUnreadable: with the LV gone, a mount
// table that cannot be read is an error, not "nothing mounted" (earlier
// review finding 27: the error was dropped and the answer was NOT_FOUND).
func TestNodeGetVolumeHealthMountTableUnreadable(t *testing.T) {
	fx := newNodeFixture(t)
	cfg, err := deviceclass.Parse([]byte(nodeClasses))
	if err != nil {
		t.Fatal(err)
	}
	ns := NewNodeServer(NodeConfig{NodeName: testNode, MaxVolumes: 100, LVM: fx.lvm,
		FS: fs.New(listFails{fx.mounter}, fx.tools), Metrics: metrics.NewRecorder(prometheus.NewRegistry()),
		Classes: cfg, View: fx.view, Formatting: fx.formatting, Eraser: signatureWiper{fx}})
	if err := fx.lvm.RemoveLV(context.Background(), "vg1", volume.LVNameFor("pvc-1")); err != nil {
		t.Fatal(err)
	}
	if err := fx.view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(fx.staging, 0o750); err != nil { // a path that exists: the table must be read
		t.Fatal(err)
	}
	_, err = ns.NodeGetVolumeHealth(context.Background(), &csi.NodeGetVolumeHealthRequest{VolumeId: fx.id, StagingTargetPath: fx.staging})
	csitest.WantCode(t, err, codes.Internal, "too many open files")
}
