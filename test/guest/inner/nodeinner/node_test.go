//go:build guestinner

// Package nodeinner runs inside the qemu guest (test/guest starts it): the
// node side of the real `carve node` binary on a loop-device volume
// group, what csi-sanity cannot see. A volume's data survives unstaging and
// a plugin restart without being formatted again, and a published volume
// grows online with its filesystem.
package nodeinner

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

var (
	carveBin  = flag.String("carve", "", "path of the carve binary (required)")
	artifacts = flag.String("artifacts", "", "directory for plugin logs (default: the test's temporary directory)")
)

const (
	mib      = int64(1) << 20
	nodeName = "guest-node"
	class    = "thick"
)

// rpcTimeout bounds each RPC: mkfs of a few hundred MiB under TCG takes
// seconds.
const rpcTimeout = 3 * time.Minute

// env is one volume group and a plugin on it.
type env struct {
	t      *testing.T
	vg     *lvmtest.LoopVG
	dir    string
	config string
	plugin *plugintest.Plugin
	log    *os.File
	// pluginEnv is added to the plugin's environment, pluginArgs to its
	// command line.
	pluginEnv, pluginArgs []string
	// notReadyOK starts the plugin even when it is not ready (a class's
	// volume group missing).
	notReadyOK bool
	// volumeContext is what CreateVolume returned for each volume ID;
	// kubelet hands it to NodeStage and NodePublish, and so do these tests.
	volumeContext map[string]map[string]string
}

// newEnv makes a VG of vgSize bytes and starts the plugin with one thick default class.
func newEnv(t *testing.T, name string, vgSize int64) *env {
	t.Helper()
	return newEnvWith(t, name, vgSize, "")
}

// newEnvWith is newEnv with more classes: extra is appended to the
// device-class file, where the VG's name is written as $VG.
func newEnvWith(t *testing.T, name string, vgSize int64, extra string) *env {
	t.Helper()
	return newEnvFor(t, name, vgSize, extra, nil)
}

// newEnvFor is newEnvWith with more of the plugin's environment.
func newEnvFor(t *testing.T, name string, vgSize int64, extra string, pluginEnv []string) *env {
	t.Helper()
	dir := t.TempDir()
	vg := lvmtest.New(t, lvmtest.Options{Dir: dir, Name: name, Size: vgSize, ExtentSize: 4 * mib, Activation: true})
	return newEnvOn(t, vg, dir, extra, pluginEnv)
}

// newEnvOn starts the plugin on a volume group made elsewhere, with its
// socket and state in dir (see newEnvWith for extra).
func newEnvOn(t *testing.T, vg *lvmtest.LoopVG, dir, extra string, pluginEnv []string) *env {
	t.Helper()
	if *carveBin == "" {
		t.Fatal("-carve must name the carve binary")
	}
	if err := plugintest.LoopbackUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	name := vg.Name
	logDir := *artifacts
	if logDir == "" {
		logDir = dir
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(logDir, "plugin-"+name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, vg: vg, dir: dir, log: log, pluginEnv: pluginEnv, config: "deviceClasses:\n  - name: " + class +
		"\n    volumeGroup: " + vg.Name + "\n    default: true\n    spare: 64Mi\n" + strings.ReplaceAll(extra, "$VG", vg.Name)}
	e.start()
	t.Cleanup(func() {
		e.stop()
		if err := log.Close(); err != nil {
			t.Errorf("closing the plugin log: %v", err)
		}
	})
	return e
}

func (e *env) start() {
	e.t.Helper()
	p, err := plugintest.Start(context.Background(), plugintest.Options{
		Binary: *carveBin, Dir: e.dir, NodeName: nodeName, Config: e.config,
		Env: append(e.vg.Env(), e.pluginEnv...), ExtraArgs: e.pluginArgs, NotReadyOK: e.notReadyOK, Log: e.log, OwnProcessGroup: true,
	})
	if err != nil {
		e.t.Fatalf("%v (plugin log: %s)", err, e.log.Name())
	}
	e.plugin = p
}

func (e *env) stop() {
	e.t.Helper()
	if e.plugin == nil {
		return
	}
	if err := e.plugin.Stop(30 * time.Second); err != nil {
		e.t.Errorf("stopping the plugin: %v (log: %s)", err, e.log.Name())
	}
	e.plugin = nil
}

func (e *env) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), rpcTimeout)
}

func (e *env) controller() csi.ControllerClient { return csi.NewControllerClient(e.plugin.Conn) }
func (e *env) node() csi.NodeClient             { return csi.NewNodeClient(e.plugin.Conn) }

// create makes a volume and deletes it when the test ends.
func (e *env) create(name string, size int64, capability *csi.VolumeCapability) string {
	e.t.Helper()
	return e.createWith(name, size, capability, nil)
}

// createWith is create with StorageClass parameters.
func (e *env) createWith(name string, size int64, capability *csi.VolumeCapability, params map[string]string) string {
	e.t.Helper()
	v, err := e.createVolume(&csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{capability},
		Parameters:         params,
	})
	if err != nil {
		e.t.Fatalf("CreateVolume %s: %v", name, err)
	}
	if got := v.GetCapacityBytes(); got < size {
		e.t.Fatalf("CreateVolume %s: capacity %d < requested %d", name, got, size)
	}
	return v.GetVolumeId()
}

// createVolume calls CreateVolume, remembers the new volume's context (for
// its NodeStage) and deletes the volume when the test ends, unless the
// plugin is stopped then.
func (e *env) createVolume(req *csi.CreateVolumeRequest) (*csi.Volume, error) {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	rsp, err := e.controller().CreateVolume(ctx, req)
	if err != nil {
		return nil, err
	}
	id := rsp.GetVolume().GetVolumeId()
	if e.volumeContext == nil {
		e.volumeContext = map[string]map[string]string{}
	}
	e.volumeContext[id] = rsp.GetVolume().GetVolumeContext()
	e.cleanupWhileServed("DeleteVolume "+id, func(ctx context.Context) error {
		_, err := e.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	})
	return rsp.GetVolume(), nil
}

// run runs f as a subtest of e's test, with e reporting to the subtest
// while it runs.
func (e *env) run(name string, f func(t *testing.T)) {
	parent := e.t
	parent.Run(name, func(t *testing.T) {
		e.t = t
		defer func() { e.t = parent }()
		f(t)
	})
}

// cleanupWhileServed has call run when the test (e.t as it is now) ends,
// unless the plugin is stopped by then; a failed call fails that test
// with what.
func (e *env) cleanupWhileServed(what string, call func(ctx context.Context) error) {
	t := e.t
	t.Cleanup(func() {
		if e.plugin == nil {
			return
		}
		ctx, cancel := e.ctx()
		defer cancel()
		if err := call(ctx); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// paths are the staging and target paths of one volume, kubelet style:
// kubelet creates the staging directory, the plugin the target.
type paths struct{ staging, target string }

func (e *env) paths(name string) paths {
	e.t.Helper()
	p := paths{staging: filepath.Join(e.dir, "staging", name), target: filepath.Join(e.dir, "pods", name, "mount")}
	if err := os.MkdirAll(p.staging, 0o750); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) stagePublish(id string, p paths, capability *csi.VolumeCapability) {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	if _, err := e.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: p.staging, VolumeCapability: capability, VolumeContext: e.volumeContext[id],
	}); err != nil {
		e.t.Fatalf("NodeStageVolume %s: %v", id, err)
	}
	if _, err := e.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: p.staging, TargetPath: p.target, VolumeCapability: capability,
		VolumeContext: e.volumeContext[id],
	}); err != nil {
		e.t.Fatalf("NodePublishVolume %s: %v", id, err)
	}
	for _, path := range []string{p.staging, p.target} {
		if ok, err := plugintest.IsMountPoint(path); err != nil || !ok {
			e.t.Fatalf("%s is not a mount point after stage and publish (%v)", path, err)
		}
	}
}

// unpublishUnstage undoes stagePublish and checks nothing stays mounted.
func (e *env) unpublishUnstage(id string, p paths) {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	if _, err := e.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: p.target}); err != nil {
		e.t.Fatalf("NodeUnpublishVolume %s: %v", id, err)
	}
	if _, err := e.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p.staging}); err != nil {
		e.t.Fatalf("NodeUnstageVolume %s: %v", id, err)
	}
	for _, path := range []string{p.staging, p.target} {
		if ok, err := plugintest.IsMountPoint(path); err != nil || ok {
			e.t.Fatalf("%s is still a mount point after unpublish and unstage (%v)", path, err)
		}
	}
}

// stepCount is how often the plugin ran a step of the stage phase since it
// started.
func (e *env) stepCount(step string) uint64 {
	e.t.Helper()
	return e.stepCountOf("stage", step)
}

// fsCases are the filesystems carve formats; xfs needs 300 MiB at least.
// fsCase is a filesystem and the sizes its volume is made with and
// expanded to.
type fsCase struct {
	fsType       string
	size, larger int64
}

var fsCases = []fsCase{
	{"ext4", 64 * mib, 128 * mib},
	{"xfs", 320 * mib, 512 * mib},
}

// fsVolume is a new volume for a mount of an fsCase's filesystem: its
// capability, ID, device node and paths.
type fsVolume struct {
	capability *csi.VolumeCapability
	id, dev    string
	p          paths
}

// eachFS runs f in a subtest per fsCase, on a new volume named prefix and
// the case's filesystem.
func (e *env) eachFS(prefix string, f func(t *testing.T, tc fsCase, v fsVolume)) {
	for _, tc := range fsCases {
		e.run(tc.fsType, func(t *testing.T) {
			capability := plugintest.MountCapability(tc.fsType)
			name := prefix + tc.fsType
			id := e.create(name, tc.size, capability)
			f(t, tc, fsVolume{capability: capability, id: id, dev: plugintest.MustDevicePath(t, id), p: e.paths(name)})
		})
	}
}

// TestDataSafety: stage, publish, write, unpublish, unstage, restart the
// plugin, stage and publish again: the data is there and the filesystem is
// the same one (same UUID, no mkfs after the restart).
func TestDataSafety(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "datasafety", 2048*mib)
	e.eachFS("data-safety-", func(t *testing.T, _ fsCase, v fsVolume) {
		capability, id, dev, p := v.capability, v.id, v.dev, v.p
		mkfsBefore := e.stepCount("mkfs")
		e.stagePublish(id, p, capability)
		if got := e.stepCount("mkfs") - mkfsBefore; got != 1 {
			t.Errorf("first stage of a blank volume ran mkfs %d times, want 1", got)
		}
		uuid, err := plugintest.FilesystemUUID(context.Background(), dev)
		if err != nil || uuid == "" {
			t.Fatalf("no filesystem UUID on %s after the first stage: %q %v", dev, uuid, err)
		}
		data := make([]byte, 4*mib)
		rand.Read(data)
		writeSynced(t, filepath.Join(p.target, "data.bin"), data)
		e.unpublishUnstage(id, p)

		e.stop()
		e.start()
		e.stagePublish(id, p, capability)
		if got := e.stepCount("mkfs"); got != 0 {
			t.Errorf("stage after the restart ran mkfs %d times: the volume was formatted again", got)
		}
		if got := e.stepCount("signature_check"); got == 0 {
			t.Error("stage after the restart did not count a signature check")
		}
		after, err := plugintest.FilesystemUUID(context.Background(), dev)
		if err != nil || after != uuid {
			t.Errorf("filesystem UUID of %s was %q, is %q after the restart (%v)", dev, uuid, after, err)
		}
		got, err := os.ReadFile(filepath.Join(p.target, "data.bin"))
		if err != nil {
			t.Fatalf("reading the file back after the restart: %v", err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("the file read back after the restart differs (%d bytes, want %d)", len(got), len(data))
		}
		e.unpublishUnstage(id, p)
	})
}

// TestOnlineExpansion: a published volume is expanded with NodeExpandVolume
// (after ControllerExpandVolume when the plugin offers it) and the mounted
// filesystem shows the new size at once.
func TestOnlineExpansion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "expansion", 2048*mib)
	e.eachFS("expand-", func(t *testing.T, tc fsCase, v fsVolume) {
		capability, id, dev, p := v.capability, v.id, v.dev, v.p
		e.stagePublish(id, p, capability)
		before := fsSize(t, p.target)
		// Data written before the resize must still be there after it.
		data := make([]byte, mib)
		rand.Read(data)
		writeSynced(t, filepath.Join(p.target, "before.bin"), data)

		ctx, cancel := e.ctx()
		defer cancel()
		if e.controllerExpands(ctx) {
			rsp, err := e.controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
				VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: tc.larger}, VolumeCapability: capability,
			})
			if err != nil {
				t.Fatalf("ControllerExpandVolume: %v", err)
			}
			t.Logf("ControllerExpandVolume: capacity %d, node expansion required %t", rsp.GetCapacityBytes(), rsp.GetNodeExpansionRequired())
		}
		rsp, err := e.node().NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
			VolumeId: id, VolumePath: p.target, StagingTargetPath: p.staging,
			CapacityRange: &csi.CapacityRange{RequiredBytes: tc.larger}, VolumeCapability: capability,
		})
		if err != nil {
			t.Fatalf("NodeExpandVolume: %v", err)
		}
		if rsp.GetCapacityBytes() < tc.larger {
			t.Errorf("NodeExpandVolume returned capacity %d, want >= %d", rsp.GetCapacityBytes(), tc.larger)
		}
		out, err := plugintest.Run(ctx, "blockdev", "--getsize64", dev)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.ParseInt(string(bytes.TrimSpace([]byte(out))), 10, 64); n < tc.larger {
			t.Errorf("%s is %d bytes after expansion, want >= %d", dev, n, tc.larger)
		}
		after := fsSize(t, p.target)
		t.Logf("%s: statfs size %d -> %d bytes (device %d -> %d)", tc.fsType, before, after, tc.size, tc.larger)
		// The filesystem must have taken (nearly) all the new space:
		// metadata of the added space costs a few percent at most.
		if grown, added := after-before, tc.larger-tc.size; grown < added*9/10 {
			t.Errorf("%s grew by %d bytes on a device that grew by %d: not resized online", tc.fsType, grown, added)
		}
		got, err := os.ReadFile(filepath.Join(p.target, "before.bin"))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("data written before the expansion is not intact (%v)", err)
		}
		stats, err := e.node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p.target})
		if err != nil {
			t.Fatalf("NodeGetVolumeStats: %v", err)
		}
		for _, u := range stats.GetUsage() {
			if u.GetUnit() == csi.VolumeUsage_BYTES && u.GetTotal() != after {
				t.Errorf("NodeGetVolumeStats total %d bytes, statfs says %d", u.GetTotal(), after)
			}
		}
		e.unpublishUnstage(id, p)
	})
}

// controllerExpands tells whether the plugin offers ControllerExpandVolume.
func (e *env) controllerExpands(ctx context.Context) bool {
	e.t.Helper()
	rsp, err := e.controller().ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range rsp.GetCapabilities() {
		if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_EXPAND_VOLUME {
			return true
		}
	}
	return false
}

// fsSize is the size statfs (what df shows) gives for the filesystem at path.
func fsSize(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize
}

func writeSynced(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
