//go:build guestinner

package lvminner

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/lvmtest"
)

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

// run runs a command (mkfs, resize2fs, blkid) with a deadline and returns
// its stdout; a failure fails the test with the command's stderr.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// newVG makes a volume group with activation on, on a loop device over a
// sparse file in the guest's /tmp (a tmpfs: only written blocks take
// memory), with an lvm.conf of its own that scans only that device; it is
// removed when the test ends. Pass vg.Env() to lvm.Options.Env.
func newVG(t testing.TB, size uint64) *lvmtest.LoopVG {
	t.Helper()
	return lvmtest.New(t, lvmtest.Options{Name: lvmtest.UniqueName("carvegt"), Size: int64(size), Activation: true})
}

// newThinPool makes a thin pool with raw lvcreate: creating pools is not
// the package's job, the administrator makes them.
func newThinPool(t testing.TB, vg *lvmtest.LoopVG, pool string, size uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := vg.CreateThinPool(ctx, pool, int64(size)); err != nil {
		t.Fatal(err)
	}
}

// lvmRaw runs a raw lvm command against vg's configuration.
func lvmRaw(t testing.TB, vg *lvmtest.LoopVG, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := vg.LVM(ctx, args...); err != nil {
		t.Fatal(err)
	}
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
	defer func() {
		if err := f.Close(); err != nil {
			t.Errorf("close %s: %v", dev, err)
		}
	}()
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
	defer func() {
		if err := f.Close(); err != nil {
			t.Errorf("close %s: %v", dev, err)
		}
	}()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	return buf
}
