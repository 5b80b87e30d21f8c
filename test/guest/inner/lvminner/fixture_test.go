//go:build guestinner

package lvminner

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

// vgSeq keeps VG names unique within the run.
var vgSeq atomic.Int32

// run runs a command with a deadline and returns its stdout; a failure
// fails the test with the command's stderr.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := runErr(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func runErr(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// newVG makes a volume group on a loop device over a sparse file in the
// guest's /tmp (a tmpfs: only written blocks take memory) and removes it
// all when the test ends.
func newVG(t testing.TB, size uint64) string {
	t.Helper()
	name := fmt.Sprintf("carvegt%d", vgSeq.Add(1))
	img := filepath.Join(t.TempDir(), name+".img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dev := strings.TrimSpace(run(t, "losetup", "--find", "--show", img))
	t.Cleanup(func() {
		if _, err := runErr("losetup", "--detach", dev); err != nil {
			t.Error(err)
		}
	})
	run(t, "lvm", "pvcreate", "--yes", dev)
	run(t, "lvm", "vgcreate", "--physicalextentsize", "4m", name, dev)
	t.Cleanup(func() {
		if _, err := runErr("lvm", "vgremove", "--yes", "--force", name); err != nil {
			t.Error(err)
		}
		if _, err := runErr("lvm", "pvremove", "--yes", dev); err != nil {
			t.Error(err)
		}
	})
	return name
}

// newThinPool makes a thin pool with raw lvcreate: creating pools is not
// the package's job, the administrator makes them.
func newThinPool(t testing.TB, vg, pool string, size uint64) {
	t.Helper()
	run(t, "lvm", "lvcreate", "--yes", "--type", "thin-pool", "--name", pool,
		"--size", fmt.Sprintf("%db", size), vg)
}

// isBlockDevice tells whether path exists and is a block device node.
func isBlockDevice(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
}

// fill writes size bytes of b (repeated) to the start of a device and
// syncs, so the data reaches the thin pool.
func fill(t testing.TB, dev string, b byte, size int) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{b}, int(mib))
	for written := 0; written < size; written += len(buf) {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// readAt reads n bytes at the start of a device.
func readHead(t testing.TB, dev string, n int) []byte {
	t.Helper()
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	return buf
}
