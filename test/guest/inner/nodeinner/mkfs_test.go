//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/marks"
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

// TestStageKeepsDataUnderAStaleMark: a formatting mark that should not be
// there never costs a volume its data. The state directory is put back
// as it was during the volume's first stage (a copy taken while its mkfs
// ran: an OS-disk rollback, a restored backup), after a pod wrote to the
// volume: the next stage finds the mark, reads the finished filesystem
// under it, drops the mark and mounts the volume with the file. The same
// for xfs under a mark naming no LV (as older carve versions made them).
// Before, such a stage zeroed the signature regions and formatted again.
func TestStageKeepsDataUnderAStaleMark(t *testing.T) {
	t.Parallel()
	mkfs := newHeldMkfs(t)
	e := newEnvFor(t, "stalemark", 1024*mib, "", mkfs.env())
	t.Cleanup(mkfs.release)
	formatting, err := marks.Open(filepath.Join(e.dir, "formatting")) // --state-dir's default: the socket's directory
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("written by a pod after the first stage\n")
	cases := []struct {
		fsType string
		size   int64
		// markAgain puts the mark of lv back after the unstage.
		markAgain func(t *testing.T, lv string)
	}{
		{fsType: "ext4", size: 64 * mib},
		{fsType: "xfs", size: 300 * mib, markAgain: func(t *testing.T, lv string) {
			if err := formatting.Mark(e.vg.Name, lv); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		name := "stale-mark-" + tc.fsType
		capability := plugintest.MountCapability(tc.fsType)
		id := e.create(name, tc.size, capability)
		lv := lvName(t, id)
		markPath := filepath.Join(formatting.Dir(), e.vg.Name, lv)
		p := e.paths(name)
		if tc.markAgain == nil {
			// The first stage, its mkfs held: copy the mark as a backup
			// of the state directory taken then would hold it.
			staged := make(chan error, 1)
			go func() { staged <- e.stage(id, p, capability, rpcTimeout) }()
			deadline := time.Now().Add(time.Minute)
			for mkfs.runs() == 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			copied, err := os.ReadFile(markPath)
			mkfs.release()
			if err != nil {
				t.Fatalf("%s: no formatting mark while its mkfs ran: %v", name, err)
			}
			if err := <-staged; err != nil {
				t.Fatalf("%s: the first NodeStageVolume: %v", name, err)
			}
			t.Logf("%s: the mark during the first stage held %q", name, copied)
			tc.markAgain = func(t *testing.T, _ string) {
				if err := os.WriteFile(markPath, copied, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		} else if err := e.stage(id, p, capability, rpcTimeout); err != nil {
			t.Fatalf("%s: the first NodeStageVolume: %v", name, err)
		}
		writeSynced(t, filepath.Join(p.staging, "file"), data)
		e.unstage(id, p)
		tc.markAgain(t, lv)
		if marked, err := formatting.Has(e.vg.Name, lv); err != nil || !marked {
			t.Fatalf("%s: the mark is not back (%v)", name, err)
		}
		if err := e.stage(id, p, capability, rpcTimeout); err != nil {
			t.Fatalf("%s: NodeStageVolume over the stale mark: %v", name, err)
		}
		got, err := os.ReadFile(filepath.Join(p.staging, "file"))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: after a stage over a stale mark the file reads %q (%v), want %q: the filesystem was made again", name, got, err, data)
		}
		if marked, err := formatting.Has(e.vg.Name, lv); err != nil || marked {
			t.Errorf("%s: the stale mark is still there after the stage (%v)", name, err)
		}
		e.unstage(id, p)
	}
}

// TestCreateOnAFullStateDisk: when the disk under the state directory is
// full, a thick CreateVolume cannot mark the LV it would make, and answers
// RESOURCE_EXHAUSTED naming the state directory (the provisioner then
// tries another node), not INTERNAL; once there is room again it works.
// The state directory here is a tmpfs with 64 inodes, filled up.
func TestCreateOnAFullStateDisk(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "fullstate", 512*mib)
	state := filepath.Join(e.dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("carve-state", state, "tmpfs", 0, "size=1m,nr_inodes=64,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(state, syscall.MNT_DETACH) })
	e.stop()
	e.pluginArgs = []string{"--state-dir=" + state}
	e.start()
	// Every inode taken.
	var filler []string
	for i := 0; ; i++ {
		p := filepath.Join(state, fmt.Sprintf("filler-%d", i))
		f, err := os.Create(p)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil || i > 1000 {
			t.Fatalf("filling the state directory: %v after %d files", err, i)
		}
		filler = append(filler, p)
		_ = f.Close()
	}
	capability := plugintest.MountCapability("ext4")
	req := &csi.CreateVolumeRequest{Name: "full-state", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib},
		VolumeCapabilities: []*csi.VolumeCapability{capability}}
	_, err := e.createVolume(req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "--state-dir") {
		t.Errorf("CreateVolume with the state directory's disk full: %v; want RESOURCE_EXHAUSTED naming --state-dir", err)
	} else {
		t.Logf("CreateVolume with the state directory's disk full: %v", err)
	}
	for _, p := range filler {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.createVolume(req); err != nil {
		t.Errorf("CreateVolume once there is room again: %v", err)
	}
}
