//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/directio"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

var (
	soakOps  = flag.Int("soak-ops", 300, "operations of TestSoakKillPlugin")
	soakSeed = flag.Int64("soak-seed", 0, "seed of TestSoakKillPlugin's schedule (0: from the clock; the test prints it)")
)

// Soak sizes: small volumes of a few extents, so that mkfs, erasure and
// the pattern checks take a fraction of a second under TCG.
const (
	soakSize     = 16 * mib
	soakGrowth   = 8 * mib
	soakMaxSize  = 40 * mib
	soakSlots    = 5 // volumes alive at once: 3 ext4, 2 raw block
	soakKillProb = 0.1
	soakAttempts = 40
	patternLen   = 256 << 10
)

// soakVol is one slot of the soak: its current volume and where it stands.
type soakVol struct {
	slot, gen int
	block     bool
	name, id  string
	size      int64
	stage     soakStage
	p         paths
	written   bool // the pattern is on the volume
}

type soakStage int

const (
	absent soakStage = iota
	created
	staged
	published
)

func (v *soakVol) capability() *csi.VolumeCapability {
	if v.block {
		return blockCapability()
	}
	return plugintest.MountCapability("ext4")
}

// pattern is what volume v holds: its own name, repeated, so that a
// volume showing another's bytes (or its own from an older generation) is
// told apart from one showing its own.
func (v *soakVol) pattern() []byte {
	unit := []byte(v.name + "|")
	return bytes.Repeat(unit, patternLen/len(unit)+1)[:patternLen]
}

// clients are the plugin's services over one connection.
type clients struct {
	cs csi.ControllerClient
	ns csi.NodeClient
}

// soak is the state of one soak run.
type soak struct {
	e    *env
	rng  *rand.Rand
	vols []*soakVol
	// mean is each operation's running mean duration when not killed,
	// the range the kill delay is drawn from.
	mean     map[string]time.Duration
	nmean    map[string]int
	expandCC bool // the plugin offers ControllerExpandVolume

	ops, kills, interrupted, retries int
	restartTime                      time.Duration
	retryCodes                       map[codes.Code]int
	// killsBy counts the kills of each killMode; lvmKilled the
	// container kills that caught an lvm command running.
	killsBy   map[killMode]int
	lvmKilled int
}

// killMode is what a kill of the soak kills.
type killMode int

const (
	// killPlugin kills the plugin process alone; the commands it started
	// (lvm, mkfs, mount) run to their end before the next plugin starts,
	// as carve's own lvm mutations always do.
	killPlugin killMode = iota
	// killContainer kills every process of the plugin's "container" (its
	// process group: the plugin and the commands it runs) at once, as
	// the kubelet or an OOM kill ends a container.
	killContainer
	// killContainerInLVM kills the container as soon as an lvm command of
	// it is seen running (in a metadata commit, or holding a device
	// suspended), or at the end of the kill window.
	killContainerInLVM
	killModes
)

func (m killMode) String() string {
	return [...]string{"plugin", "container", "container-in-lvm"}[m]
}

// TestSoakKillPlugin kills the plugin with SIGKILL at random points of a
// random sequence of create, stage, publish, expand, unpublish, unstage and
// delete calls on five volumes (ext4 and raw block), restarts it and
// retries the interrupted call, as the kubelet and csi-provisioner would,
// until it succeeds. Some kills end the plugin alone: the commands it had
// started (lvm, mkfs, mount) run to their end before the next one starts
// (drainGroup), as carve never kills an lvm mutation itself. The others
// end its whole "container" (killGroup: the plugin's process group, the
// plugin and every command it runs), as a container's end does: at a
// random point, or, for half the kills of a call that runs lvm mutations
// (create, delete, expand), as soon as an lvm mutation of it is seen
// running (awaitLVM: in a metadata commit, or holding a device
// suspended).
// After every successful call what
// it reported holds (a mount point is there or gone; a new volume's
// device is there and ListVolumes, which leaves half-made LVs out, lists
// it; a deleted one's device is gone); a
// volume published for the first time is empty (a fresh filesystem, a
// device of zeros), and each later publish shows that volume's own pattern.
// At the end every volume is deleted and nothing is left: no carve LV, no
// device-mapper device of the volume group, no mount under the test's
// directory, all extents free.
//
// The schedule comes from a seed, printed at the start (-soak-seed, or
// CARVE_SOAK_SEED on the host, replays it); -soak-ops (CARVE_SOAK_OPS) sets
// the length.
func TestSoakKillPlugin(t *testing.T) {
	t.Parallel()
	seed := *soakSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	fmt.Printf("SOAK seed %d (replay: CARVE_SOAK_SEED=%d), %d operations\n", seed, seed, *soakOps)
	start := time.Now()
	// The killed plugin's commands become this process's children, so
	// that drainGroup can wait for them.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "soak", 512*mib)
	s := &soak{e: e, rng: rand.New(rand.NewSource(seed)), mean: map[string]time.Duration{}, nmean: map[string]int{},
		retryCodes: map[codes.Code]int{}, killsBy: map[killMode]int{}}
	{
		ctx, cancel := e.ctx()
		s.expandCC = e.controllerExpands(ctx)
		cancel()
	}
	for i := 0; i < soakSlots; i++ {
		s.vols = append(s.vols, &soakVol{slot: i, block: i >= 3})
	}
	for s.ops < *soakOps {
		if s.ops%50 == 0 {
			fmt.Printf("soak: %d operations, %d kills, %d retries in %s\n", s.ops, s.kills, s.retries, time.Since(start).Round(time.Second))
		}
		v := s.vols[s.rng.Intn(len(s.vols))]
		s.step(t, v)
		if t.Failed() {
			t.Fatalf("stopping the soak at operation %d (seed %d)", s.ops, seed)
		}
	}
	// Wind down, every call still under the kill schedule, until every
	// slot is empty.
	for _, v := range s.vols {
		for v.stage != absent {
			s.step(t, v)
			if t.Failed() {
				t.Fatalf("stopping the soak while winding down at operation %d (seed %d)", s.ops, seed)
			}
		}
	}
	leaks := s.leaks(t)
	fmt.Printf("SOAK seed %d: %d operations, %d kills (%d interrupted a call; plugin %d, container %d, container in lvm %d, of which %d caught lvm running), %d retries %v, leaks found %d, %s (restarts %s)\n",
		seed, s.ops, s.kills, s.interrupted, s.killsBy[killPlugin], s.killsBy[killContainer], s.killsBy[killContainerInLVM], s.lvmKilled,
		s.retries, s.retryCodes, len(leaks), time.Since(start).Round(time.Second), s.restartTime.Round(time.Second))
	for _, l := range leaks {
		t.Errorf("leak: %s", l)
	}
	if s.kills == 0 || s.interrupted == 0 {
		t.Errorf("the soak killed the plugin %d times, %d of them during a call: it tested nothing", s.kills, s.interrupted)
	}
	if s.killsBy[killContainer]+s.killsBy[killContainerInLVM] == 0 {
		t.Error("the soak never killed the whole container")
	}
}

// step runs the next call of v, chosen at random among those its stage
// allows. Delete comes only from created (the kubelet unstages first);
// wind-down (s.ops past the target) always moves towards absent.
func (s *soak) step(t *testing.T, v *soakVol) {
	windDown := s.ops >= *soakOps
	r := s.rng.Float64()
	switch v.stage {
	case absent:
		s.create(t, v)
	case created:
		if windDown || r < 0.3 {
			s.delete(t, v)
		} else {
			s.stage(t, v)
		}
	case staged:
		if windDown || r < 0.3 {
			s.unstage(t, v)
		} else {
			s.publish(t, v)
		}
	case published:
		if !windDown && r < 0.35 && v.size+soakGrowth <= soakMaxSize {
			s.expand(t, v)
		} else {
			s.unpublish(t, v)
		}
	}
}

// call runs one CSI call, maybe killing the plugin at a random point of
// it, then restarts the plugin and retries the call until it succeeds.
// Only codes that mean "try again" (the plugin gone, a call in progress)
// are retried; any other error fails the test.
func (s *soak) call(t *testing.T, what string, do func(ctx context.Context, c clients) error) {
	t.Helper()
	s.ops++
	e := s.e
	kill := s.rng.Float64() < soakKillProb
	// The clients are taken before the kill can drop the connection.
	c := clients{e.controller(), e.node()}
	var wg sync.WaitGroup
	var delay time.Duration
	var mode killMode
	var caught string // the lvm command line a container kill caught
	returned := make(chan struct{})
	if kill {
		// Within the call's usual duration, or up to 300 ms before it is
		// known.
		span := 300 * time.Millisecond
		if m, ok := s.mean[what]; ok {
			span = m + m/5
		}
		delay = time.Duration(s.rng.Int63n(int64(span) + 1))
		if lvmCalls[what] {
			// Most kills of a call that runs lvm mutations catch one.
			mode = [...]killMode{killPlugin, killContainer, killContainerInLVM, killContainerInLVM}[s.rng.Intn(4)]
		} else {
			mode = killMode(s.rng.Intn(int(killContainerInLVM)))
		}
		p := e.plugin
		launched := time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch mode {
			case killPlugin:
				time.Sleep(delay)
			case killContainer:
				time.Sleep(delay)
				killGroup(t, p.Pid())
			case killContainerInLVM:
				caught = awaitLVM(p.Pid(), span, returned)
				delay = time.Since(launched)
				killGroup(t, p.Pid())
			}
			if err := p.Kill(); err != nil {
				t.Errorf("killing the plugin: %v", err)
			}
			drainGroup(t, p.Pid())
		}()
	}
	ctx, cancel := e.ctx()
	start := time.Now()
	err := do(ctx, c)
	took := time.Since(start)
	close(returned)
	cancel()
	wg.Wait()
	if kill {
		s.kills++
		s.killsBy[mode]++
		if err != nil {
			s.interrupted++
		}
		if caught != "" {
			s.lvmKilled++
		}
		// One line per kill, so a failing schedule can be followed.
		fmt.Printf("soak: op %d %s: %s killed after %s of %s (lvm running: %q): %v\n", s.ops, what, mode, delay.Round(time.Millisecond), took.Round(time.Millisecond), caught, status.Code(err))
		e.plugin = nil
		restart := time.Now()
		e.start()
		s.restartTime += time.Since(restart)
	} else if err == nil {
		s.mean[what] = (s.mean[what]*time.Duration(s.nmean[what]) + took) / time.Duration(s.nmean[what]+1)
		s.nmean[what]++
	}
	for attempt := 1; err != nil; attempt++ {
		code := status.Code(err)
		switch code {
		case codes.Unavailable, codes.Aborted, codes.Canceled, codes.DeadlineExceeded:
		default:
			t.Errorf("%s (attempt %d): %v: not a code to retry on", what, attempt, err)
			return
		}
		fmt.Printf("soak: op %d %s: attempt %d: %v\n", s.ops, what, attempt, err)
		if attempt == soakAttempts {
			t.Errorf("%s did not converge in %d attempts: %v", what, attempt, err)
			return
		}
		s.retries++
		s.retryCodes[code]++
		if code == codes.Aborted {
			time.Sleep(100 * time.Millisecond)
		}
		ctx, cancel := e.ctx()
		err = do(ctx, clients{e.controller(), e.node()})
		cancel()
	}
}

func (s *soak) create(t *testing.T, v *soakVol) {
	v.gen++
	v.name = fmt.Sprintf("soak-%d-%d", v.slot, v.gen)
	v.size = soakSize
	v.written = false
	req := &csi.CreateVolumeRequest{
		Name:               v.name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: v.size},
		VolumeCapabilities: []*csi.VolumeCapability{v.capability()},
	}
	var id string
	s.call(t, "create", func(ctx context.Context, c clients) error {
		rsp, err := c.cs.CreateVolume(ctx, req)
		if err == nil {
			id = rsp.GetVolume().GetVolumeId()
			if s.e.volumeContext == nil {
				s.e.volumeContext = map[string]map[string]string{}
			}
			s.e.volumeContext[id] = rsp.GetVolume().GetVolumeContext()
		}
		return err
	})
	if t.Failed() {
		return
	}
	v.id = id
	// No lvs here (each costs a fraction of a second under TCG): the
	// device node is there, and ListVolumes, which leaves out half-made
	// LVs, lists the volume. What it holds is checked at its first
	// publish.
	dev := plugintest.MustDevicePath(t, id)
	if _, err := os.Stat(dev); err != nil {
		t.Errorf("CreateVolume %s returned %s: %v", v.name, id, err)
	}
	ctx, cancel := s.e.ctx()
	defer cancel()
	list, err := s.e.controller().ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list.GetEntries(), func(e *csi.ListVolumesResponse_Entry) bool { return e.GetVolume().GetVolumeId() == id }) {
		t.Errorf("CreateVolume %s returned %s, which ListVolumes does not list as a finished volume", v.name, id)
	}
	v.p = s.e.paths(v.name)
	v.stage = created
}

func (s *soak) delete(t *testing.T, v *soakVol) {
	s.call(t, "delete", func(ctx context.Context, c clients) error {
		_, err := c.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
		return err
	})
	if t.Failed() {
		return
	}
	// lvremove takes the device node away with the LV (the leak check at
	// the end asks LVM itself).
	dev := plugintest.MustDevicePath(t, v.id)
	if _, err := os.Stat(dev); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DeleteVolume %s returned OK and %s is still there (%v)", v.id, dev, err)
	}
	delete(s.e.volumeContext, v.id)
	v.stage = absent
}

func (s *soak) stage(t *testing.T, v *soakVol) {
	s.call(t, "stage", func(ctx context.Context, c clients) error {
		_, err := c.ns.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: v.id, StagingTargetPath: v.p.staging, VolumeCapability: v.capability(), VolumeContext: s.e.volumeContext[v.id],
		})
		return err
	})
	if t.Failed() {
		return
	}
	if !v.block {
		wantMount(t, "NodeStageVolume "+v.id, v.p.staging, true)
	}
	v.stage = staged
}

func (s *soak) unstage(t *testing.T, v *soakVol) {
	s.unmount(t, v, "unstage", "NodeUnstageVolume", v.p.staging, created, func(ctx context.Context, c clients) error {
		_, err := c.ns.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.p.staging})
		return err
	})
}

func (s *soak) publish(t *testing.T, v *soakVol) {
	s.call(t, "publish", func(ctx context.Context, c clients) error {
		_, err := c.ns.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: v.id, StagingTargetPath: v.p.staging, TargetPath: v.p.target, VolumeCapability: v.capability(),
			VolumeContext: s.e.volumeContext[v.id],
		})
		return err
	})
	if t.Failed() {
		return
	}
	wantMount(t, "NodePublishVolume "+v.id, v.p.target, true)
	v.stage = published
	if !v.written {
		s.checkFresh(t, v)
		s.writePattern(t, v)
		v.written = true
	}
	s.checkPattern(t, v, "after NodePublishVolume")
}

func (s *soak) unpublish(t *testing.T, v *soakVol) {
	s.unmount(t, v, "unpublish", "NodeUnpublishVolume", v.p.target, staged, func(ctx context.Context, c clients) error {
		_, err := c.ns.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.p.target})
		return err
	})
}

// unmount makes the unpublish or unstage call op (method, for messages)
// and, once it succeeded, checks that path is no mount point and moves
// the volume to stage after.
func (s *soak) unmount(t *testing.T, v *soakVol, op, method, path string, after soakStage, call func(ctx context.Context, c clients) error) {
	s.call(t, op, call)
	if t.Failed() {
		return
	}
	wantMount(t, method+" "+v.id, path, false)
	v.stage = after
}

// expand grows a published volume, as csi-resizer and the kubelet do:
// ControllerExpandVolume when the plugin offers it, then NodeExpandVolume.
func (s *soak) expand(t *testing.T, v *soakVol) {
	size := v.size + soakGrowth
	var before int64
	if !v.block {
		before = fsSize(t, v.p.target)
	}
	rng := &csi.CapacityRange{RequiredBytes: size}
	s.call(t, "expand", func(ctx context.Context, c clients) error {
		if s.expandCC {
			if _, err := c.cs.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
				VolumeId: v.id, CapacityRange: rng, VolumeCapability: v.capability(),
			}); err != nil {
				return err
			}
		}
		rsp, err := c.ns.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
			VolumeId: v.id, VolumePath: v.p.target, StagingTargetPath: v.p.staging, CapacityRange: rng, VolumeCapability: v.capability(),
		})
		if err == nil && rsp.GetCapacityBytes() < size {
			t.Errorf("NodeExpandVolume %s returned capacity %d, want >= %d", v.id, rsp.GetCapacityBytes(), size)
		}
		return err
	})
	if t.Failed() {
		return
	}
	dev, _ := plugintest.DevicePath(v.id)
	if n := deviceSize(t, dev); n < size {
		t.Errorf("%s is %d bytes after NodeExpandVolume to %d", dev, n, size)
	}
	if !v.block {
		// ext4 takes most of the new space; its own metadata for it
		// (inode tables, bitmaps) is a few percent.
		if got := fsSize(t, v.p.target); got-before < soakGrowth*3/4 {
			t.Errorf("the filesystem of %s grew from %d to %d bytes on a device grown by %d: not resized", v.id, before, got, soakGrowth)
		}
	}
	v.size = size
	s.checkPattern(t, v, "after NodeExpandVolume")
}

// checkFresh: a volume published for the first time holds nothing: an
// empty filesystem, or zeros on a raw-block device (read through the
// published target, so the test also sees which device it was given).
func (s *soak) checkFresh(t *testing.T, v *soakVol) {
	if v.block {
		if n, size := nonZeroBytes(t, v.p.target); n != 0 || size != v.size {
			t.Errorf("new raw-block volume %s: %d non-zero bytes of %d (want 0 of %d): it shows another volume's data", v.id, n, size, v.size)
		}
		return
	}
	entries, err := os.ReadDir(v.p.target)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range entries {
		if de.Name() != "lost+found" {
			t.Errorf("new filesystem volume %s holds %s: it was not made afresh", v.id, de.Name())
		}
	}
}

func (s *soak) writePattern(t *testing.T, v *soakVol) {
	if !v.block {
		writeSynced(t, filepath.Join(v.p.target, "data.bin"), v.pattern())
		return
	}
	f, err := os.OpenFile(v.p.target, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(v.pattern(), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkPattern reads v's pattern back through its published target (past
// the page cache for a raw-block volume).
func (s *soak) checkPattern(t *testing.T, v *soakVol, when string) {
	var got []byte
	if v.block {
		got = readDirect(t, v.p.target, patternLen)
	} else {
		var err error
		if got, err = os.ReadFile(filepath.Join(v.p.target, "data.bin")); err != nil {
			t.Errorf("volume %s %s: %v", v.id, when, err)
			return
		}
	}
	if !bytes.Equal(got, v.pattern()) {
		t.Errorf("volume %s %s does not hold its own data (%d bytes, first %q)", v.id, when, len(got), got[:min(len(got), 32)])
	}
}

// leaks lists what is left once every volume was deleted.
func (s *soak) leaks(t *testing.T) []string {
	ctx := context.Background()
	e := s.e
	var out []string
	lvs, err := plugintest.CarveLVs(ctx, e.vg)
	if err != nil {
		t.Fatal(err)
	}
	for _, lv := range lvs {
		out = append(out, "carve LV "+e.vg.Name+"/"+lv)
	}
	st, err := plugintest.ReadVG(ctx, e.vg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Free != st.Size {
		out = append(out, fmt.Sprintf("volume group %s has %d of %d bytes free", e.vg.Name, st.Free, st.Size))
	}
	dm, err := plugintest.Run(ctx, "dmsetup", "ls")
	if err != nil {
		t.Fatal(err)
	}
	prefix := strings.ReplaceAll(e.vg.Name, "-", "--") + "-"
	for _, line := range strings.Split(dm, "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, "device-mapper device "+strings.Fields(line)[0])
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], e.dir+"/") {
			out = append(out, "mount "+f[4])
		}
	}
	return out
}

func wantMount(t *testing.T, what, path string, want bool) {
	t.Helper()
	ok, err := plugintest.IsMountPoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if ok != want {
		t.Errorf("%s returned OK and %s is a mount point: %v, want %v", what, path, ok, want)
	}
}

// killGroup sends SIGKILL to every process of the process group pgid: the
// plugin and the commands it runs, as a container's end kills them all.
func killGroup(t *testing.T, pgid int) {
	if err := unix.Kill(-pgid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		t.Errorf("killing process group %d: %v", pgid, err)
	}
}

// lvmCalls are the soak's calls that run lvm mutations.
var lvmCalls = map[string]bool{"create": true, "delete": true, "expand": true}

// lvmMutations are the lvm subcommands a container kill in lvm waits for:
// those that commit metadata or suspend devices.
var lvmMutations = []string{"lvcreate", "lvremove", "lvextend", "lvchange", "lvrename", "lvconvert", "vgchange"}

// awaitLVM polls /proc until a process of process group pgid runs an lvm
// mutation (lvmMutations), and returns its command line, or "" when none
// did within window or before returned is closed (the call answered).
func awaitLVM(pgid int, window time.Duration, returned <-chan struct{}) string {
	end := time.Now().Add(window)
	for time.Now().Before(end) {
		select {
		case <-returned:
			return ""
		default:
		}
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return ""
		}
		for _, de := range entries {
			if de.Name()[0] < '0' || de.Name()[0] > '9' {
				continue
			}
			stat, err := os.ReadFile(filepath.Join("/proc", de.Name(), "stat"))
			// pid (comm) state ppid pgrp ...
			if err != nil || !bytes.HasPrefix(stat[bytes.IndexByte(stat, ' ')+1:], []byte("(lvm) ")) {
				continue
			}
			f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
			if len(f) < 3 || f[2] != fmt.Sprint(pgid) {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
			if argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"); len(argv) > 1 && slices.Contains(lvmMutations, argv[1]) {
				return strings.Join(argv, " ")
			}
		}
		time.Sleep(time.Millisecond)
	}
	return ""
}

// drainGroup waits until every process of the killed plugin's process
// group has ended: the commands it started (lvm, mkfs, mount) run to their
// end before the next plugin starts, as carve's own lvm mutations always
// do. The test process is their subreaper (TestSoakKillPlugin), so it
// reaps them here.
func drainGroup(t *testing.T, pgid int) {
	done := make(chan error, 1)
	go func() {
		for {
			var ws unix.WaitStatus
			_, err := unix.Wait4(-pgid, &ws, 0, nil)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.ECHILD):
				done <- nil
				return
			case err != nil:
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("waiting for the killed plugin's commands: %v", err)
		}
	case <-time.After(plugintest.CommandTimeout):
		t.Errorf("the killed plugin's commands still run after %s", plugintest.CommandTimeout)
	}
}

// deviceSize is the size of a block device.
func deviceSize(t *testing.T, dev string) int64 {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRead(t, f)
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// readDirect reads the first n bytes of path with O_DIRECT.
func readDirect(t *testing.T, path string, n int) []byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRead(t, f)
	buf := directio.Aligned(n)
	k, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return buf[:k]
}
