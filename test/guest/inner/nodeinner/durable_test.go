//go:build guestinner

package nodeinner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// durableStep is one call of TestEveryMutationIsDurableAtItsAnswer: check
// tells whether a disk replayed to a mark shows the call's effect (nil)
// or not (an error that says what is missing).
type durableStep struct {
	name  string
	check func(r *replayed) error
}

// TestEveryMutationIsDurableAtItsAnswer: what DeleteVolume,
// NodeExpandVolume (after ControllerExpandVolume when the plugin offers
// it) and NodeStageVolume change is on the disk, not in its write cache,
// when the call answers: a power cut right after the answer must not bring
// a deleted volume back, lose an expansion (of a raw-block volume, of an
// ext4 or xfs filesystem, thick and thin) or the filesystem a stage made.
// As in TestZeroingIsFlushedBeforeCreateVolumeAnswers, the volume group's
// PV is a dm-log-writes target, which logs a write only once a FLUSH (or
// its own FUA) made it durable; before each call the test flushes and puts
// a mark in the log, and another once the call has answered. Each call's
// check then runs on the disk replayed to its answer, where it must pass,
// and on the disk replayed to the mark before the call, where it must
// fail: a check that passes there could not tell a lost change from a
// kept one. The checks: a deleted LV is not listed by LVM; a grown LV has
// its new size; a staged or grown filesystem is staged again by a new
// plugin on the replayed disk without mkfs, with the UUID and at least the
// size it had when the call answered. Without carve's flushes after
// lvremove and lvextend, the thick deletion and both raw-block growths
// fail; the thin deletion (its pool commits the delete with a flush), the
// stages (mkfs fsyncs the device) and the filesystem growths (resize2fs
// and xfs_growfs flush) are durable by themselves.
func TestEveryMutationIsDurableAtItsAnswer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l := newLoggedVG(t, dir, "durable", 1280*mib)
	if err := l.vg.CreateThinPool(context.Background(), "pool0", 128*mib); err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, l.vg, dir, "  - {name: thin, volumeGroup: $VG, thinPool: pool0, overprovisionRatio: 4}\n", nil)
	var steps []durableStep
	// step runs call between its two marks, with everything before it
	// flushed, so that the mark before holds all that came earlier.
	step := func(name string, call func() func(*replayed) error) {
		t.Helper()
		l.flush(t)
		l.mark(t, "before-"+name)
		check := call()
		l.mark(t, "answered-"+name)
		steps = append(steps, durableStep{name: name, check: check})
	}

	for _, c := range []struct{ name, class string }{{"thick", class}, {"thin", "thin"}} {
		id := e.createInClass("delete-"+c.name, 8*mib, blockCapability(), c.class)
		lv := lvName(t, id)
		step("delete-"+c.name, func() func(*replayed) error {
			e.delete(id)
			return func(r *replayed) error { return r.lvGone(lv) }
		})
	}

	var unstage []func()
	for _, c := range []struct{ name, class string }{{"thick", class}, {"thin", "thin"}} {
		name := "grow-block-" + c.name
		capability := blockCapability()
		id := e.createInClass(name, 8*mib, capability, c.class)
		p := e.paths(name)
		if err := e.stage(id, p, capability, rpcTimeout); err != nil {
			t.Fatalf("NodeStageVolume %s: %v", id, err)
		}
		e.publish(id, p, capability)
		unstage = append(unstage, func() { e.unpublishUnstage(id, p) })
		lv := lvName(t, id)
		step(name, func() func(*replayed) error {
			size := e.expand(id, p.target, 16*mib, capability)
			return func(r *replayed) error { return r.lvSize(lv, size) }
		})
	}

	for _, tc := range fsCases {
		name := "durable-" + tc.fsType
		capability := plugintest.MountCapability(tc.fsType)
		id := e.create(name, tc.size, capability)
		dev := plugintest.MustDevicePath(t, id)
		p := e.paths(name)
		step("stage-"+tc.fsType, func() func(*replayed) error {
			if err := e.stage(id, p, capability, rpcTimeout); err != nil {
				t.Fatalf("NodeStageVolume %s: %v", id, err)
			}
			return e.restages(id, dev, tc.fsType, fsSize(t, p.staging))
		})
		e.publish(id, p, capability)
		unstage = append(unstage, func() { e.unpublishUnstage(id, p) })
		step("grow-"+tc.fsType, func() func(*replayed) error {
			e.expand(id, p.target, tc.larger, capability)
			return e.restages(id, dev, tc.fsType, fsSize(t, p.target))
		})
	}

	// The log ends here: nothing mounted, the plugin stopped (the
	// cleanups of the volumes then delete nothing).
	for _, f := range unstage {
		f()
	}
	e.stop()
	wl := l.finish(t)
	fmt.Printf("DURABLE log of %d entries\n", len(wl.entries))
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			before, answered := wl.mark("before-"+s.name), wl.mark("answered-"+s.name)
			if before < 0 || answered < before {
				t.Fatalf("marks at entries %d and %d: not in the log in order", before, answered)
			}
			// The write FLUSHed or FUA'd last before the answer says what
			// made the call durable, if anything did.
			lastFlush := -1
			for i := before + 1; i < answered; i++ {
				if wl.entries[i].Flags&(logFlush|logFUA) != 0 {
					lastFlush = i
				}
			}
			atAnswer := l.replayed(t, wl, dir, "answered-"+s.name).run(s.check)
			atBefore := l.replayed(t, wl, dir, "before-"+s.name).run(s.check)
			fmt.Printf("DURABLE %s: entries %d..%d, last FLUSH/FUA at %d; after a power cut at the answer: %v; before the call: %v\n",
				s.name, before, answered, lastFlush, orOK(atAnswer), orOK(atBefore))
			if atAnswer != nil {
				t.Errorf("after a power cut right after the answer: %v", atAnswer)
			}
			if atBefore == nil {
				t.Errorf("the check passes on the disk as it was before the call: it cannot tell a lost change from a kept one")
			}
		})
	}
}

func orOK(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// publish publishes a staged volume at p.target.
func (e *env) publish(id string, p paths, capability *csi.VolumeCapability) {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	if _, err := e.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: p.staging, TargetPath: p.target, VolumeCapability: capability,
		VolumeContext: e.volumeContext[id],
	}); err != nil {
		e.t.Fatalf("NodePublishVolume %s: %v", id, err)
	}
}

// expand grows a published volume to size bytes as csi-resizer and the
// kubelet do (ControllerExpandVolume when the plugin offers it, then
// NodeExpandVolume) and returns the capacity NodeExpandVolume answered.
func (e *env) expand(id, path string, size int64, capability *csi.VolumeCapability) int64 {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	if e.controllerExpands(ctx) {
		if _, err := e.controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: capability,
		}); err != nil {
			e.t.Fatalf("ControllerExpandVolume %s: %v", id, err)
		}
	}
	rsp, err := e.node().NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
		VolumeId: id, VolumePath: path, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: capability,
	})
	if err != nil {
		e.t.Fatalf("NodeExpandVolume %s: %v", id, err)
	}
	if rsp.GetCapacityBytes() < size {
		e.t.Fatalf("NodeExpandVolume %s answered capacity %d, want >= %d", id, rsp.GetCapacityBytes(), size)
	}
	return rsp.GetCapacityBytes()
}

// restages is the check of a filesystem as a stage or a growth left it:
// a new plugin on the replayed disk stages volume id without mkfs, and
// finds the filesystem it had (the UUID on dev now) at its size (statfs
// at least size bytes). A filesystem smaller than its LV is grown by the
// stage (NodeStage's own rule), so what counts for a growth is the LV's
// size and a filesystem that mounts.
func (e *env) restages(id, dev, fsType string, size int64) func(*replayed) error {
	e.t.Helper()
	uuid, err := plugintest.FilesystemUUID(context.Background(), dev)
	if err != nil || uuid == "" {
		e.t.Fatalf("no filesystem UUID on %s: %q %v", dev, uuid, err)
	}
	volumeContext := e.volumeContext[id]
	return func(r *replayed) error {
		re, stop := r.plugin(e.config, map[string]map[string]string{id: volumeContext})
		defer stop()
		p := re.paths("restage")
		capability := plugintest.MountCapability(fsType)
		if err := re.stage(id, p, capability, rpcTimeout); err != nil {
			return fmt.Errorf("staging %s again: %w", id, err)
		}
		defer re.unstage(id, p)
		var problems []error
		if n := re.stepCount("mkfs"); n != 0 {
			problems = append(problems, fmt.Errorf("staging %s again ran mkfs %d times", id, n))
		}
		switch got, err := plugintest.FilesystemUUID(context.Background(), dev); {
		case err != nil:
			problems = append(problems, fmt.Errorf("reading the filesystem UUID: %w", err))
		case got != uuid:
			problems = append(problems, fmt.Errorf("filesystem UUID %q, want %q", got, uuid))
		}
		if got := fsSize(r.t, p.staging); got < size {
			problems = append(problems, fmt.Errorf("filesystem of %d bytes, want at least %d", got, size))
		}
		return errors.Join(problems...)
	}
}

// replayed is the volume group's disk as a power cut at a mark of the log
// leaves it, on a loop device of its own that LVM, through its own
// lvm.conf, reads alone.
type replayed struct {
	t   *testing.T
	vg  *lvmtest.LoopVG
	dir string
}

// replayed replays wl up to mark onto a new image in dir and returns it;
// run checks it and removes it all.
func (l *loggedVG) replayed(t *testing.T, wl *writeLog, dir, mark string) *replayed {
	t.Helper()
	ctx := context.Background()
	at := wl.mark(mark)
	if at < 0 {
		t.Fatalf("no mark %s in the log", mark)
	}
	rdir := filepath.Join(dir, "replay-"+mark)
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		t.Fatal(err)
	}
	size, err := os.Stat(filepath.Join(dir, "data.img"))
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(rdir, "disk.img")
	if err := wl.replay(img, size.Size(), at); err != nil {
		t.Fatal(err)
	}
	loop, err := plugintest.Run(ctx, "losetup", "--find", "--show", img)
	if err != nil {
		t.Fatal(err)
	}
	loop = strings.TrimSpace(loop)
	cfg := filepath.Join(rdir, "lvm")
	writeOnePVConfig(t, cfg, loop)
	r := &replayed{t: t, dir: rdir, vg: &lvmtest.LoopVG{Name: l.vg.Name, ConfigDir: cfg, Devices: []string{loop}, Activation: true}}
	return r
}

// run runs check on r, then deactivates what it activated and removes
// the image.
func (r *replayed) run(check func(*replayed) error) error {
	r.t.Helper()
	err := check(r)
	ctx := context.Background()
	if out, derr := r.vg.LVM(ctx, "vgchange", "--activate", "n", r.vg.Name); derr != nil {
		r.t.Errorf("deactivating the replayed volume group: %v: %s", derr, out)
	}
	if _, derr := plugintest.Run(ctx, "losetup", "--detach", r.vg.Devices[0]); derr != nil {
		r.t.Errorf("detaching %s: %v", r.vg.Devices[0], derr)
	}
	if rerr := os.RemoveAll(r.dir); rerr != nil {
		r.t.Error(rerr)
	}
	return err
}

// lvs is the field of LVM's report of LV lv on the replayed disk; found
// is false when LVM does not list it.
func (r *replayed) lvs(lv, field string) (value string, found bool, err error) {
	out, err := r.vg.LVM(context.Background(), "lvs", "--noheadings", "--units", "b", "--nosuffix", "-o", "lv_name,"+field, r.vg.Name)
	if err != nil {
		return "", false, fmt.Errorf("LVM cannot read the replayed volume group: %w: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == lv {
			return f[1], true, nil
		}
	}
	return "", false, nil
}

// lvGone: LVM does not list LV lv.
func (r *replayed) lvGone(lv string) error {
	_, found, err := r.lvs(lv, "lv_size")
	if err == nil && found {
		err = fmt.Errorf("LVM lists the deleted LV %s: the volume came back", lv)
	}
	return err
}

// lvSize: LV lv is listed with at least size bytes.
func (r *replayed) lvSize(lv string, size int64) error {
	v, found, err := r.lvs(lv, "lv_size")
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("LVM does not list LV %s", lv)
	}
	got, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return fmt.Errorf("lv_size of %s: %q", lv, v)
	}
	if got < size {
		return fmt.Errorf("LV %s is %d bytes, want %d: the expansion was lost", lv, got, size)
	}
	return nil
}

// plugin starts a plugin on the replayed disk with the device-class file
// config; volumeContext is what CreateVolume answered for the volumes it
// will stage. stop stops it.
func (r *replayed) plugin(config string, volumeContext map[string]map[string]string) (e *env, stop func()) {
	r.t.Helper()
	// Short: the plugin's socket is in it.
	dir, err := os.MkdirTemp("", "replay")
	if err != nil {
		r.t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(r.dir, "plugin.log"))
	if err != nil {
		r.t.Fatal(err)
	}
	e = &env{t: r.t, vg: r.vg, dir: dir, log: log, config: config, volumeContext: volumeContext}
	e.start()
	return e, func() {
		e.stop()
		if r.t.Failed() {
			if out, err := os.ReadFile(log.Name()); err == nil {
				r.t.Logf("the replay's plugin log ends:\n%s", lastLines(string(out), 40))
			}
		}
		if err := errors.Join(log.Close(), os.RemoveAll(dir)); err != nil {
			r.t.Error(err)
		}
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
