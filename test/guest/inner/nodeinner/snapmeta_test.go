//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The SnapshotMetadata service end to end on real device-mapper: the
// cross-node tests' router (as carve controller routes it) on a unix
// socket, node-a's agent over the node channel, thin_dump, thin_delta
// and the copy-on-write exception tables of snapshots that a known
// workload wrote.

const (
	// metaSeeds is how many workloads each kind of volume gets: each
	// costs about 10 s under TCG.
	metaSeeds = 2
	metaSize  = 32 * mib
	metaBlock = 4096
)

// workload is what a test wrote into a volume, block by block: the
// pool chunks written or discarded, for the thin model.
type workload struct {
	rng   *rand.Rand
	f     *os.File
	thin  bool
	chunk int64
	// mapped are the pool chunks a thin volume maps now (the model).
	mapped map[int64]bool
	// changed are the 4 KiB blocks written or discarded in the
	// current phase.
	changed map[int64]bool
	// blocks counts the 4 KiB blocks written or discarded.
	blocks int
	// zeroed counts discards a thick origin refused, written as zeros
	// instead.
	zeroed int
}

// phase writes n pieces of 1 to most blocks at random 4 KiB-aligned
// offsets (some land on earlier ones: overwritten), and discards one
// random pool chunk instead every discardEvery pieces (a thick origin
// takes no discards: zeros are written there); changed then holds the
// blocks written.
func (w *workload) phase(t *testing.T, n int, most int64, discardEvery int, seed string) {
	t.Helper()
	w.changed = map[int64]bool{}
	for i := range n {
		if i%discardEvery == discardEvery-1 {
			c := w.rng.Int64N(metaSize / w.chunk)
			w.discard(t, c*w.chunk, w.chunk)
			continue
		}
		blocks := 1 + w.rng.Int64N(most)
		off := w.rng.Int64N(metaSize/metaBlock-blocks) * metaBlock
		if _, err := w.f.WriteAt(fill(blocks*metaBlock, fmt.Sprintf("%s-%d", seed, i)), off); err != nil {
			t.Fatal(err)
		}
		w.mark(off, blocks*metaBlock, true)
	}
	if err := w.f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// discard discards n bytes at off (whole pool chunks).
func (w *workload) discard(t *testing.T, off, n int64) {
	t.Helper()
	r := [2]uint64{uint64(off), uint64(n)}
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, w.f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&r[0])))
	switch {
	case errno == 0:
		w.mark(off, n, false)
	case w.thin:
		t.Fatalf("discarding %d bytes at %d of a thin volume: %v", n, off, errno)
	default:
		if _, err := w.f.WriteAt(make([]byte, n), off); err != nil {
			t.Fatal(err)
		}
		w.zeroed++
		w.mark(off, n, true)
	}
}

// mark records n bytes at off written (or discarded): the blocks, and
// the pool chunks mapped (or, discarded whole, unmapped).
func (w *workload) mark(off, n int64, written bool) {
	w.blocks += int(n / metaBlock)
	if written {
		for b := off / metaBlock; b < (off+n)/metaBlock; b++ {
			w.changed[b] = true
		}
	}
	for c := off / w.chunk; c <= (off+n-1)/w.chunk; c++ {
		w.mapped[c] = written
	}
}

// emptyOnA makes an empty volume of class on node-a and records its PV.
func (c *cluster) emptyOnA(name, class string) string {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	v, err := c.nodes["node-a"].local().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: metaSize},
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")}, Parameters: map[string]string{"carve.dev/device-class": class}})
	if err != nil {
		t.Fatalf("CreateVolume %s on node-a: %v", name, err)
	}
	id := v.GetVolume().GetVolumeId()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pvs[id] = []string{"node-a"}
	return id
}

// metadataClient serves the router's SnapshotMetadata service on a unix
// socket, as carve controller serves it, and returns its client.
func (c *cluster) metadataClient() csi.SnapshotMetadataClient {
	t := c.t
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	csi.RegisterSnapshotMetadataServer(g, c.router.Metadata())
	go func() { _ = g.Serve(l) }() // ends with Stop
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return csi.NewSnapshotMetadataClient(conn)
}

// extent is one BlockMetadata.
type extent struct{ off, n int64 }

// metaMessages is what a stream of either call holds.
type metaMessages interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}

// drain reads a stream to its end: its extents and how many messages,
// checking each message's type, capacity and count.
func drain[T metaMessages](t *testing.T, recv func() (T, error), most int) ([]extent, int, error) {
	t.Helper()
	var out []extent
	msgs := 0
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return out, msgs, nil
		}
		if err != nil {
			return out, msgs, err
		}
		msgs++
		if m.GetBlockMetadataType() != csi.BlockMetadataType_VARIABLE_LENGTH || m.GetVolumeCapacityBytes() != metaSize || (most > 0 && len(m.GetBlockMetadata()) > most) {
			t.Fatalf("a message of type %v, capacity %d, %d extents (max %d)", m.GetBlockMetadataType(), m.GetVolumeCapacityBytes(), len(m.GetBlockMetadata()), most)
		}
		for _, b := range m.GetBlockMetadata() {
			out = append(out, extent{b.GetByteOffset(), b.GetSizeBytes()})
		}
	}
}

func (c *cluster) delta(t *testing.T, cl csi.SnapshotMetadataClient, base, target string, start int64, most int32) ([]extent, int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	s, err := cl.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: start, MaxResults: most})
	if err != nil {
		return nil, 0, err
	}
	return drain(t, s.Recv, int(most))
}

func (c *cluster) allocated(t *testing.T, cl csi.SnapshotMetadataClient, snap string) ([]extent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	s, err := cl.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: snap})
	if err != nil {
		return nil, err
	}
	got, _, err := drain(t, s.Recv, 0)
	return got, err
}

// readSnapshot activates node-a's snapshot id (a thin one is made
// with the activation-skip flag) and reads its whole volume.
func (c *cluster) readSnapshot(t *testing.T, id string) []byte {
	t.Helper()
	_, vg, lv, err := volume.ParseSnapshotID(id)
	if err != nil {
		t.Fatal(err)
	}
	dev := plugintest.MustDevicePath(t, vg+"/"+lv)
	if _, err := os.Stat(dev); err != nil { // a thick snapshot is active with its origin
		if out, err := c.nodes["node-a"].vg.LVM(context.Background(), "lvchange", "-ay", "-K", vg+"/"+lv); err != nil {
			t.Fatalf("activating %s: %v: %s", id, err, out)
		}
	}
	return readDevice(t, dev, 0, metaSize)
}

// lvField is one lvs field of node-a's LV vg/lv, trimmed.
func (c *cluster) lvField(t *testing.T, vgLV, field string) string {
	t.Helper()
	out, err := c.nodes["node-a"].vg.LVM(context.Background(), "lvs", "--noheadings", "--units", "b", "--nosuffix", "-o", field, vgLV)
	if err != nil {
		t.Fatalf("lvs %s: %v: %s", vgLV, err, out)
	}
	return strings.TrimSpace(string(out))
}

// metadataSnapHeld tells whether node-a's pool0 holds a metadata
// snapshot (the seventh field of its status).
func (c *cluster) metadataSnapHeld(t *testing.T) bool {
	t.Helper()
	vg := c.nodes["node-a"].vg.Name
	out, err := exec.CommandContext(context.Background(), "dmsetup", "status", strings.ReplaceAll(vg, "-", "--")+"-pool0-tpool").CombinedOutput()
	if err != nil {
		t.Fatalf("dmsetup status: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) < 7 {
		t.Fatalf("dmsetup status: %q", out)
	}
	return f[6] != "-"
}

// TestSnapshotMetadata: for thin and thick volumes of node-a and
// metaSeeds seeds each, a known workload (pieces of 1-8 blocks at random offsets, some
// over earlier ones, some chunks discarded) is written, snapshotted,
// written again, snapshotted, and written once more (the workload goes
// on). Through the router: GetMetadataDelta covers every block that
// differs between the two snapshots (read whole and compared), exactly
// at the pool's chunk size for thin, as a superset for thick (its ratio
// is logged); the second snapshot rebuilt from the first and only the
// named extents has its SHA-256; on the first seed, GetMetadataAllocated
// of a thin snapshot is exactly the chunks the workload left mapped, of
// a thick one the whole volume, pages of 7 from the middle are the tail
// of the whole answer, and a base newer than the target is refused; bad
// input is refused naming the field; and afterwards
// no metadata snapshot is held and no snapshot the agent activated is
// left active.
func TestSnapshotMetadata(t *testing.T) {
	c := newCluster(t, 768*mib, 256*mib)
	cl := c.metadataClient()
	vgName := c.nodes["node-a"].vg.Name
	chunk, err := strconv.ParseInt(c.lvField(t, vgName+"/pool0", "chunk_size"), 10, 64)
	if err != nil || chunk <= 0 {
		t.Fatalf("the pool's chunk size: %d, %v", chunk, err)
	}
	var firstS1, otherS2 string
	for _, class := range []string{"thin", "thick"} {
		for seed := range metaSeeds {
			name := fmt.Sprintf("meta-%s-%d", class, seed)
			t.Run(name, func(t *testing.T) {
				id := c.emptyOnA(name, class)
				dev := plugintest.MustDevicePath(t, id)
				f, err := os.OpenFile(dev, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = f.Close() }()
				w := &workload{rng: rand.New(rand.NewPCG(uint64(seed), 36)), f: f, thin: class == "thin", chunk: chunk, mapped: map[int64]bool{}}
				w.phase(t, 1000, 8, 10, name+"-1")
				s1 := c.snapshotOnA(name+"-s1", id)
				s1At := time.Now()
				mappedAtS1 := maps.Clone(w.mapped)
				w.phase(t, 400, 4, 25, name+"-2")
				written2 := w.changed
				mappedAtS2 := maps.Clone(w.mapped)
				if d := time.Second + 100*time.Millisecond - time.Since(s1At); d > 0 && seed == 0 {
					time.Sleep(d) // LVM times snapshots to the second: the order check below
				}
				s2 := c.snapshotOnA(name+"-s2", id)
				w.phase(t, 60, 4, 25, name+"-3")
				if seed == 0 && class == "thin" {
					firstS1 = s1
				}
				if seed == 1 && class == "thin" {
					otherS2 = s2
				}

				start := time.Now()
				delta, msgs, err := c.delta(t, cl, s1, s2, 0, 0)
				if err != nil {
					t.Fatalf("GetMetadataDelta: %v", err)
				}
				took := time.Since(start)
				_, svg, slv, _ := volume.ParseSnapshotID(s1)
				if active := c.lvField(t, svg+"/"+slv, "lv_active"); class == "thin" && active != "" {
					t.Errorf("snapshot %s is left %q after the call", s1, active)
				}
				if c.metadataSnapHeld(t) {
					t.Error("the pool holds a metadata snapshot after the call")
				}
				var alloc []extent
				if seed == 0 {
					if alloc, err = c.allocated(t, cl, s1); err != nil {
						t.Fatalf("GetMetadataAllocated: %v", err)
					}
				}

				old, cur := c.readSnapshot(t, s1), c.readSnapshot(t, s2)
				named := func(off, n int64) bool {
					for _, e := range delta {
						if e.off <= off && off+n <= e.off+e.n {
							return true
						}
					}
					return false
				}
				var differ, missing int64
				diffChunks := map[int64]bool{}
				for off := int64(0); off < metaSize; off += metaBlock {
					if bytes.Equal(old[off:off+metaBlock], cur[off:off+metaBlock]) {
						continue
					}
					differ++
					diffChunks[off/chunk] = true
					if !named(off, metaBlock) {
						missing++
					}
				}
				for b := range written2 {
					// A thin chunk written and then discarded reads zeros, as
					// it may have at the first snapshot.
					if w.thin && !mappedAtS2[b*metaBlock/chunk] {
						continue
					}
					if !named(b*metaBlock, metaBlock) {
						t.Errorf("block %d, written or discarded between the snapshots, is not in the delta", b)
						break
					}
				}
				var deltaBytes int64
				for _, e := range delta {
					deltaBytes += e.n
				}
				if missing > 0 || differ == 0 {
					t.Fatalf("%d of the %d blocks that differ are not in the delta", missing, differ)
				}
				rebuilt := bytes.Clone(old)
				for _, e := range delta {
					copy(rebuilt[e.off:e.off+e.n], cur[e.off:e.off+e.n])
				}
				if sha256.Sum256(rebuilt) != sha256.Sum256(cur) {
					t.Fatal("the second snapshot rebuilt from the first and the named extents differs from it")
				}
				if class == "thin" && deltaBytes != int64(len(diffChunks))*chunk {
					t.Errorf("thin delta of %d bytes, the chunks that differ hold %d", deltaBytes, int64(len(diffChunks))*chunk)
				}
				switch {
				case seed > 0:
					// Allocated blocks, paging and order are checked on
					// the first seed; each costs a call.
				case class == "thin":
					var want int64
					for c, m := range mappedAtS1 {
						if m {
							want += chunk
							if !inExtents(alloc, c*chunk, chunk) {
								t.Fatalf("chunk %d, mapped at the first snapshot, is not allocated", c)
							}
						}
					}
					if got := sumExtents(alloc); got != want {
						t.Errorf("allocated %d bytes, the workload left %d mapped", got, want)
					}
				case len(alloc) != 1 || alloc[0] != (extent{0, metaSize}):
					t.Errorf("a thick snapshot's allocated blocks: %v, want the whole volume", alloc)
				}
				t.Logf("SNAPMETA %s seed %d: %d blocks written or discarded (%d discards written as zeros); %d blocks differ between the snapshots (%d bytes); delta %d extents in %d messages, %d bytes (%.2f x the bytes that differ), named in %s; allocated %d bytes",
					class, seed, w.blocks, w.zeroed, differ, differ*metaBlock, len(delta), msgs, deltaBytes, float64(deltaBytes)/float64(differ*metaBlock), took.Round(time.Millisecond), sumExtents(alloc))

				if seed > 0 {
					return
				}
				half, pages, err := c.delta(t, cl, s1, s2, metaSize/2, 7)
				if err != nil {
					t.Fatalf("GetMetadataDelta from the middle: %v", err)
				}
				i := 0
				for i < len(delta) && delta[i].off+delta[i].n <= metaSize/2 {
					i++
				}
				if fmt.Sprint(half) != fmt.Sprint(delta[i:]) || pages < (len(half)+6)/7 {
					t.Errorf("from the middle in pages of 7: %d extents in %d messages, want the %d of the whole answer's tail", len(half), pages, len(delta)-i)
				}
				if _, _, err := c.delta(t, cl, s2, s1, 0, 0); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "base_snapshot_id") {
					t.Errorf("a base newer than the target: %v, want INVALID_ARGUMENT naming base_snapshot_id", err)
				}
			})
		}
	}

	t.Run("bad input", func(t *testing.T) {
		gone := volume.SnapshotID("node-a", vgName, volume.SnapshotLVNameFor("gone"))
		for _, tt := range []struct {
			name, base, target string
			code               codes.Code
			field              string
		}{
			{"a base of another volume", firstS1, otherS2, codes.InvalidArgument, "base_snapshot_id"},
			{"an unknown target", firstS1, gone, codes.NotFound, "target_snapshot_id"},
			{"an unknown base", gone, otherS2, codes.NotFound, "base_snapshot_id"},
		} {
			if _, _, err := c.delta(t, cl, tt.base, tt.target, 0, 0); status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("%s: %v, want %v naming %s", tt.name, err, tt.code, tt.field)
			}
		}
		if _, err := c.allocated(t, cl, gone); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "snapshot_id") {
			t.Errorf("an unknown snapshot: %v, want NOT_FOUND naming snapshot_id", err)
		}
		if c.metadataSnapHeld(t) {
			t.Error("the pool holds a metadata snapshot after refused calls")
		}
	})

	t.Run("client gone", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := cl.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: otherS2, MaxResults: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		cancel()
		if c.metadataSnapHeld(t) {
			t.Error("the pool holds a metadata snapshot after the client went away")
		}
		if _, err := c.allocated(t, cl, otherS2); err != nil {
			t.Errorf("the next call after a client went away: %v", err)
		}
	})
}

func inExtents(es []extent, off, n int64) bool {
	for _, e := range es {
		if e.off <= off && off+n <= e.off+e.n {
			return true
		}
	}
	return false
}

func sumExtents(es []extent) int64 {
	var n int64
	for _, e := range es {
		n += e.n
	}
	return n
}
