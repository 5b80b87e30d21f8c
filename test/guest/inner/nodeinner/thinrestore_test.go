//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The thin restore tests copy a thick snapshot into a thin class, on real
// dm-thin: a thin target takes only the source's non-zero data, and a
// copy that could overflow the pool is refused before anything is made.

// poolDataPercent is the data_percent of the env's pool0.
func (e *env) poolDataPercent() float64 {
	e.t.Helper()
	s := strings.TrimSpace(e.lvField("pool0", "data_percent"))
	p, err := strconv.ParseFloat(s, 64)
	if err != nil {
		e.t.Fatalf("data_percent of pool0 is %q: %v", s, err)
	}
	return p
}

// TestThinRestoreWritesOnlyData: a 256 MiB thick volume with 4 MiB
// written, restored from its snapshot into a thin class, grows the pool
// by about the 4 MiB (not by 256 MiB of zeros), reads back as its source,
// and a second thin volume of the pool is still writable.
func TestThinRestoreWritesOnlyData(t *testing.T) {
	t.Parallel()
	e := newSnapEnv(t, "thinsparse")
	const size, written = 256 * mib, 4 * mib
	t.Logf("pool0 zeroes new blocks (lvs zero): %q", e.lvField("pool0", "zero"))
	id, dev := e.blockVolume("sparse-source", size, "thick")
	// 2 MiB at the start, 2 MiB in the middle: the zeros between and
	// after must not be written.
	head, middle := random(written/2), random(written/2)
	writeDevice(t, dev, head)
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(middle, size/2); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	snap := e.snapshot("sparse-snap", id)
	want := hashDevice(t, dev, size)

	before := e.poolDataPercent()
	rid, err := e.fromSource("sparse-restored", size, blockCapability(), "thin", snapshotSource(snap.GetSnapshotId()))
	if err != nil {
		t.Fatalf("restore into the thin class: %v", err)
	}
	after := e.poolDataPercent()
	// pool0 is 768 MiB: 4 MiB is 0.52 %; 256 MiB would be 33 %.
	grown := (after - before) / 100 * 768
	t.Logf("pool0 data_percent %.2f -> %.2f (%.1f MiB) after restoring %d MiB of data in a %d MiB volume; the restored LV's data_percent: %s",
		before, after, grown, written/mib, size/mib, e.lvField(lvName(t, rid), "data_percent"))
	if grown > float64(2*written/mib) {
		t.Errorf("the restore took %.1f MiB of the pool for %d MiB of data: it wrote the source's zeros", grown, written/mib)
	}
	rdev := plugintest.MustDevicePath(t, rid)
	if got := hashDevice(t, rdev, size); got != want {
		t.Error("the restored thin volume differs from its source")
	}
	_, odev := e.blockVolume("sparse-other", 64*mib, "thin")
	data := random(16 * mib)
	writeDevice(t, odev, data)
	if got := readDevice(t, odev, 0, 16*mib); !bytes.Equal(got, data) {
		t.Error("a second thin volume of the pool does not read back what was written to it")
	}
}

// smallPoolClasses is a thin class on a 128 MiB pool.
const smallPoolClasses = `  - name: thin
    volumeGroup: $VG
    thinPool: pool0
    overprovisionRatio: 4
`

// TestThinRestoreOverflowRefused: a restore into a thin class of more
// data than the pool has free (192 MiB written, 128 MiB pool; the
// overprovision ratio of 4 admits it as a volume) is refused with
// RESOURCE_EXHAUSTED naming the pool, before any LV is made, and the pool
// is as it was.
func TestThinRestoreOverflowRefused(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, "thinfull", 1024*mib, smallPoolClasses)
	e.stop()
	if err := e.vg.CreateThinPool(context.Background(), "pool0", 128*mib); err != nil {
		t.Fatal(err)
	}
	e.start()
	// Today's code filled the pool: a full pool then fails its writes
	// after 1 s rather than 60, so that the test ends soon.
	const timeoutParam = "/sys/module/dm_thin_pool/parameters/no_space_timeout"
	if old, err := os.ReadFile(timeoutParam); err == nil {
		if err := os.WriteFile(timeoutParam, []byte("1"), 0); err == nil {
			t.Cleanup(func() {
				if err := os.WriteFile(timeoutParam, old, 0); err != nil {
					t.Error(err)
				}
			})
		}
	}
	const size = 192 * mib
	id, dev := e.blockVolume("full-source", size, "thick")
	writeDevice(t, dev, bytes.Repeat(pattern[:mib], int(size/mib)))
	snap := e.snapshot("full-snap", id)
	before := e.poolDataPercent()

	_, err := e.fromSource("full-restored", size, blockCapability(), "thin", snapshotSource(snap.GetSnapshotId()))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("restore of %d MiB of data into a 128 MiB pool: %v, want ResourceExhausted", size/mib, err)
	}
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "pool0") {
		t.Errorf("the refusal does not name the pool: %q", msg)
	}
	t.Logf("refused: %v", err)
	out, err := e.vg.LVM(context.Background(), "lvs", "--noheadings", "-o", "lv_name", e.vg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if target := volume.LVNameFor("full-restored"); strings.Contains(string(out), target) {
		t.Errorf("the refused restore left its LV %s", target)
	}
	if after := e.poolDataPercent(); after > before+1 {
		t.Errorf("pool0 data_percent went from %.2f to %.2f on a refused restore", before, after)
	}
}
