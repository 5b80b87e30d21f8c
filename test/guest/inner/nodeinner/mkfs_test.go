//go:build guestinner

package nodeinner

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-csi/carve/pkg/marks"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// TestStageAfterAKilledMkfs: a stage marks its volume (in the plugin's
// state directory) before mkfs and takes the mark off before it answers.
// The plugin's container killed during mkfs (its mkfs dies with it), or
// the node going down, leaves the mark and whatever mkfs wrote so far: for
// xfs a superblock flagged "in progress" and AGs half made, which the
// kernel refuses to mount. The next stage zeroes those remains and makes
// the filesystem again.
//
//   - remains with a mark: the stage makes a new filesystem (a new UUID);
//   - the same remains without a mark (the control, what every retry met
//     before the mark): carve does not format a device with a signature it
//     did not start, and the mount fails ("Structure needs cleaning");
//   - an mkfs.xfs really killed part way, with the mark: staged.
func TestStageAfterAKilledMkfs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "killedmkfs", 1024*mib)
	ctx := context.Background()
	marks, err := marks.Open(filepath.Join(e.dir, "formatting")) // --state-dir's default: the socket's directory
	if err != nil {
		t.Fatal(err)
	}
	capability := plugintest.MountCapability("xfs")
	const size = 300 * mib // xfsprogs' smallest xfs
	flaggedRemains := func(dev string) string {
		t.Helper()
		if _, err := plugintest.Run(ctx, "mkfs.xfs", "-q", "-f", dev); err != nil {
			t.Fatal(err)
		}
		if _, err := plugintest.Run(ctx, "xfs_db", "-x", "-c", "sb 0", "-c", "write inprogress 1", dev); err != nil {
			t.Fatal(err)
		}
		uuid, err := plugintest.FilesystemUUID(ctx, dev)
		if err != nil || uuid == "" {
			t.Fatalf("the remains have no UUID (%q, %v)", uuid, err)
		}
		return uuid
	}
	stageAndUnstage := func(name, id string) {
		t.Helper()
		p := e.paths(name)
		if err := e.stage(id, p, capability, 2*time.Minute); err != nil {
			t.Fatalf("NodeStageVolume of %s: %v", name, err)
		}
		if ok, err := plugintest.IsMountPoint(p.staging); err != nil || !ok {
			t.Fatalf("%s is not mounted after its stage (%v)", name, err)
		}
		e.unstage(id, p)
	}
	for _, marked := range []bool{true, false} {
		name := map[bool]string{true: "flagged-marked", false: "flagged-unmarked"}[marked]
		id := e.create(name, size, capability)
		dev := "/dev/" + e.vg.Name + "/" + lvName(t, id)
		old := flaggedRemains(dev)
		if marked {
			if err := marks.Mark(e.vg.Name, lvName(t, id)); err != nil {
				t.Fatal(err)
			}
			stageAndUnstage(name, id)
		} else if err := e.stage(id, e.paths(name), capability, 2*time.Minute); err == nil {
			t.Errorf("%s: the remains of an unfinished mkfs were staged without a mark; the control expected the mount to fail", name)
		} else {
			t.Logf("%s, the control: %v", name, err)
		}
		now, err := plugintest.FilesystemUUID(ctx, dev)
		switch {
		case err != nil:
			t.Errorf("%s: %v", name, err)
		case marked && now == old:
			t.Errorf("%s: the stage mounted the remains of the unfinished mkfs (UUID %s) instead of making the filesystem again", name, old)
		case !marked && now != old:
			t.Errorf("%s: without a mark the stage formatted a device that had a signature (UUID %s, now %s)", name, old, now)
		}
		if has, err := marks.Has(e.vg.Name, lvName(t, id)); err != nil || has {
			t.Errorf("%s: marked after its stage (%v, %v)", name, has, err)
		}
	}

	// A real mkfs.xfs, killed part way.
	id := e.create("killed", size, capability)
	dev := "/dev/" + e.vg.Name + "/" + lvName(t, id)
	if err := marks.Mark(e.vg.Name, lvName(t, id)); err != nil {
		t.Fatal(err)
	}
	mkfs := exec.CommandContext(ctx, "mkfs.xfs", "-q", "-f", "-K", dev)
	if err := mkfs.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	_ = mkfs.Process.Kill()
	state, _ := mkfs.Process.Wait()
	t.Logf("mkfs.xfs killed after 50 ms: %v", state)
	stageAndUnstage("killed", id)
}
