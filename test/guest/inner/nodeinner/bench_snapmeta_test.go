//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/node/directio"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// deltaGiB is the size of TestBenchSnapshotDelta's thin volume.
var deltaGiB = flag.Int64("bench-delta-gib", 10, "GiB of TestBenchSnapshotDelta's thin volume")

// TestBenchSnapshotDelta: the changes between two snapshots of a thin
// volume (deltaGiB, 5 % of its 64 KiB chunks written before the first
// snapshot, then 1 % of them rewritten or newly written) named by
// GetMetadataDelta through the router (activation of both snapshots,
// thin_delta on a reserved metadata snapshot, deactivation), against
// naming them by reading both snapshots whole and comparing them chunk by
// chunk, as a backup tool without changed-block tracking must (the
// snapshots active already: their activation is not timed). It checks
// that the delta is exactly the chunks the reading found; it prints the
// ratio, and asserts no time.
func TestBenchSnapshotDelta(t *testing.T) {
	size := *deltaGiB << 30
	// Each node's volume group is a sparse file in the guest's tmpfs:
	// only what is written takes memory. The pool takes the volume and
	// its two snapshots at the class's overprovision ratio of 4.
	pool := (3*size/4 + 256*mib) / (4 * mib) * (4 * mib)
	c := newCluster(t, pool+512*mib, pool)
	cl := c.metadataClient()
	vg := c.nodes["node-a"].vg.Name
	chunk, err := strconv.ParseInt(c.lvField(t, vg+"/pool0", "chunk_size"), 10, 64)
	if err != nil || chunk <= 0 {
		t.Fatalf("the pool's chunk size: %d, %v", chunk, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	v, err := c.nodes["node-a"].local().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "bench-delta", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{blockCapability()}, Parameters: map[string]string{"carve.dev/device-class": "thin"}})
	cancel()
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	id := v.GetVolume().GetVolumeId()
	dev := plugintest.MustDevicePath(t, id)
	chunks := size / chunk
	start := time.Now()
	var seeded []int64
	for ch := int64(0); ch < chunks; ch += 20 {
		seeded = append(seeded, ch)
	}
	writeChunks(t, dev, chunk, seeded, 1)
	s1 := c.snapshotOnA("bench-delta-s1", id)
	rng := rand.New(rand.NewPCG(36, 1))
	changed := map[int64]bool{}
	var second []int64
	for int64(len(changed)) < chunks/100 {
		ch := rng.Int64N(chunks)
		if !changed[ch] {
			changed[ch] = true
			second = append(second, ch)
		}
	}
	writeChunks(t, dev, chunk, second, 2)
	s2 := c.snapshotOnA("bench-delta-s2", id)
	t.Logf("%d GiB thin volume: %d chunks of %d KiB written, then %d; snapshots taken in %s", *deltaGiB, len(seeded), chunk>>10, len(second), time.Since(start).Round(time.Second))

	const calls = 3
	var named []time.Duration
	var delta []extent
	for range calls {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		s, err := cl.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: s1, TargetSnapshotId: s2})
		if err != nil {
			cancel()
			t.Fatalf("GetMetadataDelta: %v", err)
		}
		delta = delta[:0]
		for {
			m, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				cancel()
				t.Fatalf("GetMetadataDelta: %v", err)
			}
			for _, b := range m.GetBlockMetadata() {
				delta = append(delta, extent{b.GetByteOffset(), b.GetSizeBytes()})
			}
		}
		cancel()
		named = append(named, time.Since(start))
	}
	if c.metadataSnapHeld(t) {
		t.Error("the pool holds a metadata snapshot after the calls")
	}

	paths := make([]string, 2)
	for i, s := range []string{s1, s2} {
		_, svg, slv, err := volume.ParseSnapshotID(s)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := c.nodes["node-a"].vg.LVM(context.Background(), "lvchange", "-ay", "-K", svg+"/"+slv); err != nil {
			t.Fatalf("activating %s: %v: %s", s, err, out)
		}
		if paths[i], err = plugintest.DevicePath(svg + "/" + slv); err != nil {
			t.Fatal(err)
		}
	}
	start = time.Now()
	differ := compareDevices(t, paths[0], paths[1], size, chunk)
	read := time.Since(start)

	var deltaBytes int64
	for _, e := range delta {
		deltaBytes += e.n
	}
	for _, ch := range differ {
		if !inExtents(delta, ch*chunk, chunk) {
			t.Fatalf("chunk %d differs between the snapshots and is not in the delta", ch)
		}
	}
	if deltaBytes != int64(len(differ))*chunk || len(differ) != len(second) {
		t.Errorf("the delta names %d bytes; %d chunks differ (%d bytes), %d were written", deltaBytes, len(differ), int64(len(differ))*chunk, len(second))
	}
	m := median(named)
	fmt.Printf("ratio carve/raw snapshot delta of a %d GiB thin volume, 1%% of it changed: %.4f (carve GetMetadataDelta median %s over %d calls, %d extents, %d MiB; reading and comparing both snapshots whole %s, %.0f MiB/s)\n",
		*deltaGiB, float64(m)/float64(read), m.Round(time.Millisecond), calls, len(delta), deltaBytes>>20, read.Round(time.Millisecond), float64(2*size>>20)/read.Seconds())
}

// writeChunks writes each of the chunks (their index) of the device dev
// whole with data stamped with the chunk and round, and syncs.
func writeChunks(t *testing.T, dev string, chunk int64, chunks []int64, round uint64) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := directio.Aligned(int(chunk))
	copy(buf, fill(chunk, "bench-delta"))
	for _, c := range chunks {
		binary.LittleEndian.PutUint64(buf[0:8], uint64(c))
		binary.LittleEndian.PutUint64(buf[8:16], round)
		if _, err := f.WriteAt(buf, c*chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// compareDevices reads the devices a and b whole (size bytes, O_DIRECT, 4
// MiB at a time) and returns the chunks that differ.
func compareDevices(t *testing.T, a, b string, size, chunk int64) []int64 {
	t.Helper()
	const block = 4 * mib
	var files [2]*os.File
	var bufs [2][]byte
	for i, p := range []string{a, b} {
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer closeRead(t, f)
		files[i], bufs[i] = f, directio.Aligned(int(block))
	}
	var differ []int64
	for off := int64(0); off < size; off += block {
		n := min(block, size-off)
		for i := range files {
			if _, err := files[i].ReadAt(bufs[i][:n], off); err != nil {
				t.Fatalf("reading at %d: %v", off, err)
			}
		}
		for c := int64(0); c < n; c += chunk {
			if !bytes.Equal(bufs[0][c:c+chunk], bufs[1][c:c+chunk]) {
				differ = append(differ, (off+c)/chunk)
			}
		}
	}
	return differ
}
