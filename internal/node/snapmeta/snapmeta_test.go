package snapmeta

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/provision"
)

// source answers every map with m or err and records what it was asked.
type source struct {
	m     provision.BlockMap
	err   error
	asked []string
}

func (s *source) SnapshotAllocated(_ context.Context, id string) (provision.BlockMap, error) {
	s.asked = append(s.asked, "allocated "+id)
	return s.m, s.err
}

func (s *source) SnapshotDelta(_ context.Context, base, target string) (provision.BlockMap, error) {
	s.asked = append(s.asked, "delta "+base+".."+target)
	return s.m, s.err
}

// stream records what is sent; after cancelAfter messages (when > 0)
// its context ends, as when the client goes away.
type stream struct {
	grpc.ServerStream
	ctx         context.Context
	cancel      context.CancelFunc
	cancelAfter int
	sent        []*nodeagentv1.SnapshotBlocksResponse
}

func newStream(t *testing.T, cancelAfter int) *stream {
	ctx, cancel := context.WithCancel(t.Context())
	return &stream{ctx: ctx, cancel: cancel, cancelAfter: cancelAfter}
}

func (s *stream) Context() context.Context { return s.ctx }

func (s *stream) Send(r *nodeagentv1.SnapshotBlocksResponse) error {
	s.sent = append(s.sent, r)
	if len(s.sent) == s.cancelAfter {
		s.cancel()
	}
	return nil
}

// extents is n extents of 64 KiB, one every 128 KiB.
func extents(n int) changemap.Set {
	var s changemap.Set
	for i := range n {
		s = s.Add(uint64(i)*128<<10, 64<<10)
	}
	return s
}

// TestSnapshotBlocksPages: extents come in pages of max_results (1024
// when 0), from the extent that holds starting_offset or the first
// after it, each message naming the snapshots and the capacity; an
// allocated map is asked without a base, a delta with one.
func TestSnapshotBlocksPages(t *testing.T) {
	const capacity = 2500 * 128 << 10
	all := extents(2500)
	tests := []struct {
		name      string
		base      string
		start     int64
		max       int32
		wantPages []int
		wantFirst uint64
		wantAsked string
	}{
		{"allocated, default pages", "", 0, 0, []int{1024, 1024, 452}, 0, "allocated n/vg/s2"},
		{"delta, pages of 1000", "n/vg/s1", 0, 1000, []int{1000, 1000, 500}, 0, "delta n/vg/s1..n/vg/s2"},
		{"one per message", "", capacity - 3*128<<10, 1, []int{1, 1, 1}, 2497 * 128 << 10, "allocated n/vg/s2"},
		{"from the middle of an extent", "", 1250*128<<10 + 1000, 2000, []int{1250}, 1250 * 128 << 10, "allocated n/vg/s2"},
		{"from a gap", "", 1250*128<<10 + 64<<10, 2000, []int{1249}, 1251 * 128 << 10, "allocated n/vg/s2"},
		{"from the end", "", capacity, 0, nil, 0, "allocated n/vg/s2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &source{m: provision.BlockMap{Capacity: capacity, Blocks: all, Method: provision.MapThinDump}}
			st := newStream(t, 0)
			err := (&Server{Source: src}).SnapshotBlocks(&nodeagentv1.SnapshotBlocksRequest{SnapshotId: "n/vg/s2", BaseSnapshotId: tt.base,
				StartingOffset: tt.start, MaxResults: tt.max}, st)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(src.asked, []string{tt.wantAsked}) {
				t.Errorf("asked %q, want %q", src.asked, tt.wantAsked)
			}
			var pages []int
			var got changemap.Set
			for _, r := range st.sent {
				pages = append(pages, len(r.GetBlocks()))
				if r.GetSnapshotId() != "n/vg/s2" || r.GetBaseSnapshotId() != tt.base || r.GetVolumeCapacityBytes() != capacity {
					t.Errorf("a message of %q against %q of %d bytes", r.GetSnapshotId(), r.GetBaseSnapshotId(), r.GetVolumeCapacityBytes())
				}
				for _, b := range r.GetBlocks() {
					got = append(got, changemap.Extent{Off: uint64(b.GetOffset()), Len: uint64(b.GetLength())})
				}
			}
			if !slices.Equal(pages, tt.wantPages) {
				t.Errorf("pages of %v extents, want %v", pages, tt.wantPages)
			}
			if len(got) > 0 && (got[0].Off != tt.wantFirst || !slices.Equal(got, all[len(all)-len(got):])) {
				t.Errorf("first extent at %d, want %d; or the extents are not the map's tail", got[0].Off, tt.wantFirst)
			}
		})
	}
}

// TestSnapshotBlocksErrors: bad offsets and counts, and the block map's
// errors, come back as statuses naming the field.
func TestSnapshotBlocksErrors(t *testing.T) {
	tests := []struct {
		name     string
		start    int64
		max      int32
		err      error
		wantCode codes.Code
		wantMsg  string
	}{
		{"negative offset", -1, 0, nil, codes.OutOfRange, "starting_offset: -1 is negative"},
		{"offset beyond the volume", 1<<20 + 1, 0, nil, codes.OutOfRange, "starting_offset: 1048577 is beyond the volume's capacity of 1048576 bytes"},
		{"negative max_results", 0, -1, nil, codes.InvalidArgument, "max_results"},
		{"unknown snapshot", 0, 0, provision.Errorf(provision.ErrNotFound, "snapshot_id: snapshot x does not exist"), codes.NotFound, "snapshot_id: snapshot x does not exist"},
		{"base of another volume", 0, 0, provision.Errorf(provision.ErrInvalid, "base_snapshot_id: of another volume"), codes.InvalidArgument, "base_snapshot_id"},
		{"being made", 0, 0, provision.Errorf(provision.ErrBusy, "snapshot_id: in flight"), codes.Aborted, "snapshot_id"},
		{"overflowed", 0, 0, provision.Errorf(provision.ErrRefused, "base_snapshot_id: ran out"), codes.FailedPrecondition, "base_snapshot_id"},
		{"pool busy", 0, 0, provision.Errorf(provision.ErrUnavailable, "held already"), codes.Unavailable, "held already"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &source{m: provision.BlockMap{Capacity: 1 << 20, Blocks: extents(8)}, err: tt.err}
			st := newStream(t, 0)
			err := (&Server{Source: src}).SnapshotBlocks(&nodeagentv1.SnapshotBlocksRequest{SnapshotId: "n/vg/s", StartingOffset: tt.start, MaxResults: tt.max}, st)
			if s := status.Convert(err); s.Code() != tt.wantCode || !strings.Contains(s.Message(), tt.wantMsg) {
				t.Fatalf("got %v, want %v saying %q", err, tt.wantCode, tt.wantMsg)
			}
			if len(st.sent) != 0 {
				t.Errorf("%d messages sent before the error", len(st.sent))
			}
		})
	}
}

// TestSnapshotBlocksClientGone: a client that goes away stops the
// stream at the next message.
func TestSnapshotBlocksClientGone(t *testing.T) {
	src := &source{m: provision.BlockMap{Capacity: 10000 * 128 << 10, Blocks: extents(10000)}}
	st := newStream(t, 2)
	err := (&Server{Source: src}).SnapshotBlocks(&nodeagentv1.SnapshotBlocksRequest{SnapshotId: "n/vg/s", MaxResults: 10}, st)
	if status.Code(err) != codes.Canceled || len(st.sent) != 2 {
		t.Fatalf("got %v after %d messages, want Canceled after 2", err, len(st.sent))
	}
}
