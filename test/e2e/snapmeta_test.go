//go:build e2e

package e2e

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
)

// metaSnapSize is the size of the snapshots TestSnapshotMetadataThroughTheController reads.
const metaSnapSize = 64 << 20

// metaSnapshot makes on node n a thick LV tagged as carve's snapshot name of
// origin (the bed's LVM makes no copy-on-write snapshot without
// device-mapper: its LVs are metadata only) and returns its snapshot ID.
func metaSnapshot(t *testing.T, ctx context.Context, n *cluster.Node, name, origin string) string {
	t.Helper()
	lv := volume.SnapshotLVNameFor(name)
	args := []string{"lvcreate", "--yes", "--activate", "n", "--zero", "n", "--name", lv, "--size", "64m"}
	for _, tag := range volume.SnapshotTags(name, "thick", origin) {
		args = append(args, "--addtag", tag)
	}
	if _, err := n.VG.LVM(ctx, append(args, n.VG.Name)...); err != nil {
		t.Fatalf("the snapshot LV on %s: %v", n.Name, err)
	}
	t.Cleanup(func() { removeLVIfThere(t, n, lv) })
	return volume.SnapshotID(n.Name, n.VG.Name, lv)
}

// metaExtent is one extent of an answer; metaAnswer all of a stream.
type metaExtent struct{ off, n int64 }

type metaAnswer struct {
	capacity int64
	types    map[csi.BlockMetadataType]bool
	extents  []metaExtent
	messages int
}

// readAllocated reads GetMetadataAllocated whole.
func readAllocated(ctx context.Context, cl csi.SnapshotMetadataClient, req *csi.GetMetadataAllocatedRequest) (metaAnswer, error) {
	a := metaAnswer{types: map[csi.BlockMetadataType]bool{}}
	s, err := cl.GetMetadataAllocated(ctx, req)
	if err != nil {
		return a, err
	}
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return a, nil
		}
		if err != nil {
			return a, err
		}
		a.messages++
		a.capacity = m.GetVolumeCapacityBytes()
		a.types[m.GetBlockMetadataType()] = true
		for _, b := range m.GetBlockMetadata() {
			a.extents = append(a.extents, metaExtent{b.GetByteOffset(), b.GetSizeBytes()})
		}
	}
}

// TestSnapshotMetadataThroughTheController: the CSI SnapshotMetadata
// service on carve controller's socket (the controller Deployment's
// process, as the external-snapshot-metadata sidecar reaches it), which
// advertises it, answers for a snapshot of a node agent it reaches over
// the node channel: a thick snapshot's allocated blocks are its whole
// volume in one VARIABLE_LENGTH extent, also from a starting_offset
// halfway (the extent that holds it), and a starting_offset past the
// volume is OUT_OF_RANGE; an ID naming another node is answered by that
// node (NOT_FOUND), a delta across two nodes is refused without a node
// (INVALID_ARGUMENT), and a delta no device-mapper metadata maps is
// refused by the node's one implementation of "what changed since"
// (FAILED_PRECONDITION), each naming the field; a client that goes away
// mid-call leaves the snapshot unlocked (the next call is answered at
// once) and not active. The bed has no device-mapper: thin snapshots, real
// deltas, paging over many extents and the pool's metadata snapshot are
// the guest tier's (TestSnapshotMetadata).
func TestSnapshotMetadataThroughTheController(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	holder, other := bed.Nodes[2], bed.Nodes[1]
	origin := volume.LVNameFor("pvc-e2e-meta")
	s1 := metaSnapshot(t, ctx, holder, "e2e-meta-1", origin)
	s2 := metaSnapshot(t, ctx, holder, "e2e-meta-2", origin)
	elsewhere := metaSnapshot(t, ctx, other, "e2e-meta-other", origin)
	conn, err := grpc.NewClient("unix://"+bed.Central.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	cl := csi.NewSnapshotMetadataClient(conn)

	caps, err := csi.NewIdentityClient(conn).GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	advertised := false
	for _, c := range caps.GetCapabilities() {
		advertised = advertised || c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE
	}
	if !advertised {
		t.Errorf("carve controller does not advertise SNAPSHOT_METADATA_SERVICE: %v", caps.GetCapabilities())
	}

	whole := []metaExtent{{0, metaSnapSize}}
	for _, tt := range []struct {
		name  string
		start int64
		most  int32
	}{{"from the start", 0, 0}, {"from halfway, one a message", metaSnapSize / 2, 1}, {"from the last byte", metaSnapSize - 1, 0}} {
		t.Run("allocated "+tt.name, func(t *testing.T) {
			start := time.Now()
			a, err := readAllocated(ctx, cl, &csi.GetMetadataAllocatedRequest{SnapshotId: s1, StartingOffset: tt.start, MaxResults: tt.most})
			if err != nil {
				t.Fatalf("GetMetadataAllocated of %s on %s: %v", s1, holder.Name, err)
			}
			t.Logf("answered in %s: %d messages", time.Since(start).Round(time.Millisecond), a.messages)
			if a.capacity != metaSnapSize || len(a.types) != 1 || !a.types[csi.BlockMetadataType_VARIABLE_LENGTH] {
				t.Errorf("capacity %d, types %v; want %d, VARIABLE_LENGTH", a.capacity, a.types, metaSnapSize)
			}
			if len(a.extents) != 1 || a.extents[0] != whole[0] {
				t.Errorf("extents %v, want %v: a thick snapshot is allocated whole", a.extents, whole)
			}
		})
	}

	refused := []struct {
		name   string
		call   func() error
		code   codes.Code
		fields []string
	}{
		{"a starting_offset past the volume", func() error {
			_, err := readAllocated(ctx, cl, &csi.GetMetadataAllocatedRequest{SnapshotId: s1, StartingOffset: metaSnapSize + 1})
			return err
		}, codes.OutOfRange, []string{"starting_offset"}},
		{"an ID naming another node than the LV's", func() error {
			_, _, lv, err := volume.ParseSnapshotID(s1)
			if err != nil {
				return err
			}
			_, err = readAllocated(ctx, cl, &csi.GetMetadataAllocatedRequest{SnapshotId: volume.SnapshotID(other.Name, holder.VG.Name, lv)})
			return err
		}, codes.NotFound, []string{"snapshot_id", other.Name}},
		{"a delta across two nodes", func() error {
			s, err := cl.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: elsewhere, TargetSnapshotId: s2})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}, codes.InvalidArgument, []string{"base_snapshot_id"}},
		{"a delta no metadata maps", func() error {
			s, err := cl.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: s1, TargetSnapshotId: s2})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}, codes.FailedPrecondition, []string{"base_snapshot_id", "no metadata maps"}},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if status.Code(err) != tt.code {
				t.Fatalf("got %v, want %v", err, tt.code)
			}
			for _, f := range tt.fields {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("%v does not name %q", err, f)
				}
			}
		})
	}

	t.Run("a client that goes away mid-call", func(t *testing.T) {
		for range 3 {
			cctx, cancel := context.WithCancel(ctx)
			s, err := cl.GetMetadataAllocated(cctx, &csi.GetMetadataAllocatedRequest{SnapshotId: s2, MaxResults: 1})
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			cancel()
			if _, err := s.Recv(); status.Code(err) != codes.Canceled && err != nil {
				t.Errorf("the stream after the client canceled: %v", err)
			}
		}
		// The node handles a stream its client left in the background:
		// the next call waits for nothing it left held (a lock held would
		// be ABORTED).
		start := time.Now()
		if _, err := readAllocated(ctx, cl, &csi.GetMetadataAllocatedRequest{SnapshotId: s2}); err != nil {
			t.Errorf("the call after clients went away: %v", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("the call after clients went away took %s", d)
		}
		_, _, lv, err := volume.ParseSnapshotID(s2)
		if err != nil {
			t.Fatal(err)
		}
		out, err := holder.VG.LVM(ctx, "lvs", "--noheadings", "-o", "lv_active,lv_attr", holder.VG.Name+"/"+lv)
		if err != nil {
			t.Fatal(err)
		}
		// lvs answers "unknown" for an LV's state where activation is off,
		// as on this bed; where it can tell, the LV must not be active.
		if f := strings.Fields(string(out)); len(f) == 0 || f[0] == "active" || len(f[len(f)-1]) < 5 || f[len(f)-1][4] == 'a' {
			t.Errorf("snapshot %s after the calls: lvs says %q, want it not active", s2, out)
		}
	})
}
