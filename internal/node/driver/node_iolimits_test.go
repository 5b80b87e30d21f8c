package driver

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/iolimit"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

const podUID = "0f4c5b1e-8a3d-4c2b-9e7f-1a2b3c4d5e6f"

// limitFixture is the node fixture with a fake cgroup v2 tree (the pod
// podUID's burstable cgroup, its io.max empty), the fixture's target a
// kubelet path of that pod, its device 253:3, and the Controller server
// applying limits through the Node server, as the node role wires them.
type limitFixture struct {
	*nodeFixture
	ioMax string
}

func newLimitFixture(t *testing.T, controllers string) *limitFixture {
	t.Helper()
	fx := &limitFixture{nodeFixture: newNodeFixture(t)}
	root := t.TempDir()
	pod := filepath.Join(root, "kubepods", "burstable", "pod"+podUID)
	if err := os.MkdirAll(pod, 0o755); err != nil {
		t.Fatal(err)
	}
	fx.ioMax = filepath.Join(pod, "io.max")
	for file, content := range map[string]string{filepath.Join(root, "cgroup.controllers"): controllers + "\n", fx.ioMax: ""} {
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fx.ns.cfg.Cgroups = iolimit.Cgroups{Root: root}
	fx.ns.deviceOf = func(path string) (iolimit.Device, error) {
		if path != fx.device {
			t.Errorf("numbers of %s read; the volume's device is %s", path, fx.device)
		}
		return iolimit.Device{Major: 253, Minor: 3}, nil
	}
	fx.ns.isDeviceNode = func(path string) bool { return path == fx.device }
	fx.cs.cfg.Limits = fx.ns
	fx.target = filepath.Join(t.TempDir(), "kubelet", "pods", podUID, "volumes", "kubernetes.io~csi", "pv-1", "mount")
	return fx
}

func (fx *limitFixture) readIOMax(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(fx.ioMax)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tag puts limit tags on the fixture's volume, as a modify or a create
// recorded them, and lets the view see them.
func (fx *limitFixture) tag(t *testing.T, l volume.IOLimits) {
	t.Helper()
	fx.setLV(fx.id, func(lv *lvm.LogicalVolume) { lv.Tags = append(lv.Tags, volume.IOLimitTags(l)...) })
	if err := fx.view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// wantApplications checks that limits were applied want times with result.
func (fx *limitFixture) wantApplications(t *testing.T, result string, want int) {
	t.Helper()
	if got := testutil.ToFloat64(fx.ns.cfg.Metrics.IOLimitApplications(result)); got != float64(want) {
		t.Errorf("applications %s = %v, want %d", result, got, want)
	}
}

// stagedPublish stages the fixture's volume as a filesystem and answers
// its NodePublishVolume.
func (fx *limitFixture) stagedPublish(t *testing.T) error {
	fx.stage(t, mountCap("", sw))
	_, err := fx.ns.NodePublishVolume(context.Background(), fx.publishReq(mountCap("", sw), false))
	return err
}

func (fx *limitFixture) modify(params map[string]string) error {
	_, err := fx.cs.ControllerModifyVolume(context.Background(), &csi.ControllerModifyVolumeRequest{VolumeId: fx.id, MutableParameters: params})
	return err
}

// A volume's limits reach its pod's io.max at publish, before the mount;
// a node that cannot apply them refuses the publish and mounts nothing.
func TestNodePublishAppliesIOLimits(t *testing.T) {
	for _, block := range []bool{false, true} {
		t.Run(map[bool]string{false: "filesystem", true: "block"}[block], func(t *testing.T) {
			fx := newLimitFixture(t, "cpu io memory")
			fx.tag(t, volume.IOLimits{WriteBPS: 10 << 20, ReadIOPS: 200})
			c := mountCap("", sw)
			if block {
				c = blockCap(sw)
				fx.target = filepath.Join(t.TempDir(), "kubelet", "plugins", "kubernetes.io", "csi", "volumeDevices", "publish", "pv-1", podUID)
			} else {
				fx.stage(t, c)
			}
			fx.publish(t, c, false)
			if got, want := fx.readIOMax(t), "253:3 rbps=max wbps=10485760 riops=200 wiops=max"; got != want {
				t.Errorf("io.max = %q, want %q", got, want)
			}
			if fx.mountAt(fx.target) == nil {
				t.Error("not published")
			}
			fx.wantApplications(t, "ok", 1)
		})
	}
	t.Run("no io controller", func(t *testing.T) {
		fx := newLimitFixture(t, "cpu memory")
		fx.tag(t, volume.IOLimits{WriteBPS: 1 << 20})
		err := fx.stagedPublish(t)
		csitest.WantCode(t, err, codes.FailedPrecondition, "IO limits", "io controller")
		if fx.mountAt(fx.target) != nil || fx.readIOMax(t) != "" {
			t.Error("published, or io.max written, on a node that cannot apply limits")
		}
		fx.wantApplications(t, "unsupported", 1)
	})
	t.Run("pod cgroup not there", func(t *testing.T) {
		fx := newLimitFixture(t, "io")
		fx.tag(t, volume.IOLimits{WriteBPS: 1 << 20})
		fx.target = filepath.Join(t.TempDir(), "kubelet", "pods", "11111111-2222-3333-4444-555555555555", "volumes", "kubernetes.io~csi", "pv-1", "mount")
		err := fx.stagedPublish(t)
		csitest.WantCode(t, err, codes.Unavailable, "pod cgroup not found")
	})
	t.Run("no limits: cgroups untouched", func(t *testing.T) {
		fx := newLimitFixture(t, "cpu memory")
		fx.stage(t, mountCap("", sw))
		fx.publish(t, mountCap("", sw), false)
		if fx.readIOMax(t) != "" {
			t.Error("io.max written for a volume without limits")
		}
	})
}

// ControllerModifyVolume rewrites the io.max of the pod that has the
// volume published; parameters merge over what the volume has, "max"
// lifts one, a repeat changes nothing (the tags it records are
// provision's TestSetIOLimits).
func TestControllerModifyVolumeAppliesLive(t *testing.T) {
	fx := newLimitFixture(t, "io")
	fx.stage(t, mountCap("", sw))
	fx.publish(t, mountCap("", sw), false)
	if fx.readIOMax(t) != "" {
		t.Fatal("io.max written for a volume without limits")
	}
	steps := []struct {
		params   map[string]string
		wantLine string
	}{
		{map[string]string{volume.ParamWriteBytesPerSecond: "10Mi"}, "253:3 rbps=max wbps=10485760 riops=max wiops=max"},
		{map[string]string{volume.ParamReadIOPS: "300"}, "253:3 rbps=max wbps=10485760 riops=300 wiops=max"},
		{map[string]string{volume.ParamReadIOPS: "300"}, "253:3 rbps=max wbps=10485760 riops=300 wiops=max"},
		{map[string]string{volume.ParamWriteBytesPerSecond: "max", volume.ParamReadIOPS: "max"}, "253:3 rbps=max wbps=max riops=max wiops=max"},
	}
	for i, s := range steps {
		if err := fx.modify(s.params); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if line := fx.readIOMax(t); line != s.wantLine {
			t.Errorf("step %d: io.max = %q, want %q", i, line, s.wantLine)
		}
	}
	fx.wantApplications(t, "ok", len(steps))
}

func TestControllerModifyVolumeRefusals(t *testing.T) {
	fx := newLimitFixture(t, "io")
	for _, tc := range []struct {
		name   string
		id     string
		params map[string]string
		code   codes.Code
		msg    []string
	}{
		{name: "no volume id", params: nil, code: codes.InvalidArgument, msg: []string{"volume_id"}},
		{name: "unknown key", id: fx.id, params: map[string]string{"XXX_FakeKey": "v"}, code: codes.InvalidArgument,
			msg: []string{"XXX_FakeKey", volume.ParamReadBytesPerSecond}},
		{name: "bad value", id: fx.id, params: map[string]string{volume.ParamWriteIOPS: "fast"}, code: codes.InvalidArgument,
			msg: []string{volume.ParamWriteIOPS, `"fast"`, "whole number"}},
		{name: "not carve's ID", id: "non-existing-volume-id", code: codes.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fx.cs.ControllerModifyVolume(context.Background(), &csi.ControllerModifyVolumeRequest{VolumeId: tc.id, MutableParameters: tc.params})
			csitest.WantCode(t, err, tc.code, tc.msg...)
		})
	}
	tags, _ := fx.lvm.LVTags("vg1", volume.LVNameFor(fx.name))
	if slices.ContainsFunc(tags, volume.IsIOLimitTag) {
		t.Errorf("a refused modify left tags %v", tags)
	}
	// No parameters: nothing to change, success.
	if err := fx.modify(nil); err != nil {
		t.Errorf("modify without parameters: %v", err)
	}
}

// A node without the io controller records the limits and says it cannot
// apply them.
func TestControllerModifyVolumeWithoutIOController(t *testing.T) {
	fx := newLimitFixture(t, "cpu memory")
	err := fx.modify(map[string]string{volume.ParamWriteBytesPerSecond: "1Mi"})
	csitest.WantCode(t, err, codes.FailedPrecondition, "recorded", "io controller")
	tags, _ := fx.lvm.LVTags("vg1", volume.LVNameFor(fx.name))
	if !slices.Contains(tags, "carve.dev/wbps=1048576") {
		t.Errorf("tags %v: the limit is not recorded", tags)
	}
}

// At the agent's start, the limits on the LVs reach the pods they are
// published to.
func TestReapplyIOLimits(t *testing.T) {
	fx := newLimitFixture(t, "io")
	fx.stage(t, mountCap("", sw))
	fx.publish(t, mountCap("", sw), false)
	fx.tag(t, volume.IOLimits{ReadBPS: 5 << 20})
	if err := fx.ns.ReapplyIOLimits(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := fx.readIOMax(t), "253:3 rbps=5242880 wbps=max riops=max wiops=max"; got != want {
		t.Errorf("io.max = %q, want %q", got, want)
	}
	if v := testutil.ToFloat64(fx.ns.cfg.Metrics.IOLimitsSupported(iolimit.ReasonOK)); v != 1 {
		t.Errorf("carve_io_limits_supported{reason=ok} = %v", v)
	}
}

// CreateVolume records the StorageClass's limits and, over them, the
// VolumeAttributesClass's (mutable parameters), which hold only limits.
func TestCreateVolumeRecordsIOLimits(t *testing.T) {
	fx := newControllerFixture(t)
	req := createReq("pvc-limited", gib, map[string]string{volume.ParamWriteBytesPerSecond: "1Mi", volume.ParamReadIOPS: "50"})
	req.MutableParameters = map[string]string{volume.ParamWriteBytesPerSecond: "2Mi"}
	resp, err := fx.cs.CreateVolume(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	vg, name, _ := volume.ParseVolumeID(resp.GetVolume().GetVolumeId())
	tags, _ := fx.lvm.LVTags(vg, name)
	if got, want := volume.IOLimitsFromTags(tags), (volume.IOLimits{WriteBPS: 2 << 20, ReadIOPS: 50}); got != want {
		t.Errorf("limits %+v, want %+v (tags %v)", got, want, tags)
	}
	bad := createReq("pvc-bad", gib, nil)
	bad.MutableParameters = map[string]string{"XXX_FakeKey": "XXX_FakeValue"}
	_, err = fx.cs.CreateVolume(context.Background(), bad)
	csitest.WantCode(t, err, codes.InvalidArgument, "mutable_parameters", "XXX_FakeKey")
	_, err = fx.cs.CreateVolume(context.Background(), createReq("pvc-bad", gib, map[string]string{volume.ParamReadIOPS: "0"}))
	csitest.WantCode(t, err, codes.InvalidArgument, "parameters", volume.ParamReadIOPS)
}
