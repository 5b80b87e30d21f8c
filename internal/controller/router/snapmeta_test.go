package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// blockAgent is a fake node agent's SnapshotBlocks: it answers each
// request with answer(req) (messages, then err), or, with hold, sends
// the first message and waits for the caller to go away, noting that
// it saw the cancel.
type blockAgent struct {
	nodeagentv1.UnimplementedNodeAgentServer
	answer func(req *nodeagentv1.SnapshotBlocksRequest) ([]*nodeagentv1.SnapshotBlocksResponse, error)
	hold   bool

	mu        sync.Mutex
	asked     []string
	cancelled chan struct{}
}

func (a *blockAgent) SnapshotBlocks(req *nodeagentv1.SnapshotBlocksRequest, stream nodeagentv1.NodeAgent_SnapshotBlocksServer) error {
	a.mu.Lock()
	a.asked = append(a.asked, fmt.Sprintf("%s..%s from %d max %d", req.GetBaseSnapshotId(), req.GetSnapshotId(), req.GetStartingOffset(), req.GetMaxResults()))
	a.mu.Unlock()
	msgs, err := a.answer(req)
	for i, m := range msgs {
		if err := stream.Send(m); err != nil {
			return err
		}
		if a.hold && i == 0 {
			<-stream.Context().Done()
			close(a.cancelled)
			return stream.Context().Err()
		}
	}
	return err
}

// blockAgents are fake Agents: node -> its agent's client; a node not
// in it is unreachable.
type blockAgents map[string]nodeagentv1.NodeAgentClient

func (a blockAgents) NodeAgent(_ context.Context, node string) (nodeagentv1.NodeAgentClient, error) {
	c, ok := a[node]
	if !ok {
		return nil, fmt.Errorf("node %s: no connection: %w", node, ErrUnreachable)
	}
	return c, nil
}

func (a blockAgents) Host(string) (string, error) { return "", errors.New("no copies here") }

// dialServer serves register's services on an in-memory listener until
// the test ends and returns a connection to it.
func dialServer(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	register(g)
	go func() { _ = g.Serve(lis) }() // ends with Stop
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// metadataRouter is a router whose node-b agent is a, served over gRPC,
// its SnapshotMetadata service's client, and its refusals.
func metadataRouter(t *testing.T, a *blockAgent) (csi.SnapshotMetadataClient, *Refusals) {
	t.Helper()
	node := nodeagentv1.NewNodeAgentClient(dialServer(t, func(g *grpc.Server) { nodeagentv1.RegisterNodeAgentServer(g, a) }))
	r, err := NewRefusals(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Agents: blockAgents{"node-b": node}, Refusals: r})
	return csi.NewSnapshotMetadataClient(dialServer(t, func(g *grpc.Server) { csi.RegisterSnapshotMetadataServer(g, s.Metadata()) })), r
}

// honest answers a request as a node does: the snapshots asked, a
// 1 MiB volume, extents of 64 KiB every 128 KiB from starting_offset,
// two per message.
func honest(req *nodeagentv1.SnapshotBlocksRequest) ([]*nodeagentv1.SnapshotBlocksResponse, error) {
	var out []*nodeagentv1.SnapshotBlocksResponse
	for off := req.GetStartingOffset() / (128 << 10) * (128 << 10); off < 1<<20; off += 256 << 10 {
		m := &nodeagentv1.SnapshotBlocksResponse{SnapshotId: req.GetSnapshotId(), BaseSnapshotId: req.GetBaseSnapshotId(), VolumeCapacityBytes: 1 << 20}
		for o := off; o < off+256<<10 && o < 1<<20; o += 128 << 10 {
			m.Blocks = append(m.Blocks, &nodeagentv1.BlockExtent{Offset: o, Length: 64 << 10})
		}
		out = append(out, m)
	}
	return out, nil
}

// readAll reads a GetMetadataDelta or GetMetadataAllocated stream to its
// end: the extents, the messages' types and capacities, and the error.
func readAll[T interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}](recv func() (T, error)) (extents []string, msgs int, err error) {
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return extents, msgs, nil
		}
		if err != nil {
			return extents, msgs, err
		}
		msgs++
		if m.GetBlockMetadataType() != csi.BlockMetadataType_VARIABLE_LENGTH || m.GetVolumeCapacityBytes() != 1<<20 {
			return extents, msgs, fmt.Errorf("a message of type %v, capacity %d", m.GetBlockMetadataType(), m.GetVolumeCapacityBytes())
		}
		for _, b := range m.GetBlockMetadata() {
			extents = append(extents, fmt.Sprintf("%d+%d", b.GetByteOffset()>>10, b.GetSizeBytes()>>10))
		}
	}
}

// TestMetadataRouting: each stream goes to the node its snapshot ID
// names, with the request's offset and count, and comes back as
// VARIABLE_LENGTH extents; bad input is refused before any node is
// asked, naming the field; a node's own error keeps its code.
func TestMetadataRouting(t *testing.T) {
	base, target := sid("node-b", "monday"), sid("node-b", "tuesday")
	a := &blockAgent{answer: honest}
	c, _ := metadataRouter(t, a)
	ctx := t.Context()

	s, err := c.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: 512 << 10, MaxResults: 2})
	if err != nil {
		t.Fatal(err)
	}
	got, msgs, err := readAll(s.Recv)
	if err != nil || strings.Join(got, " ") != "512+64 640+64 768+64 896+64" || msgs != 2 {
		t.Fatalf("delta from 512 KiB: %v in %d messages, %v", got, msgs, err)
	}
	al, err := c.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: target})
	if err != nil {
		t.Fatal(err)
	}
	if got, msgs, err := readAll(al.Recv); err != nil || len(got) != 8 || msgs != 4 {
		t.Fatalf("allocated: %v in %d messages, %v", got, msgs, err)
	}
	if want := []string{base + ".." + target + " from 524288 max 2", ".." + target + " from 0 max 0"}; strings.Join(a.asked, "|") != strings.Join(want, "|") {
		t.Errorf("the node was asked %q, want %q", a.asked, want)
	}

	a.asked = nil
	for _, tt := range []struct {
		name     string
		delta    *csi.GetMetadataDeltaRequest
		alloc    *csi.GetMetadataAllocatedRequest
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "no snapshot", alloc: &csi.GetMetadataAllocatedRequest{}, wantCode: codes.InvalidArgument, wantMsg: "snapshot_id: must be set"},
		{name: "no base", delta: &csi.GetMetadataDeltaRequest{TargetSnapshotId: target}, wantCode: codes.InvalidArgument, wantMsg: "base_snapshot_id: must be set"},
		{name: "not carve's", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: "pvc-1"}, wantCode: codes.NotFound, wantMsg: "snapshot_id: snapshot \"pvc-1\" does not exist"},
		{name: "base not carve's", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: "x", TargetSnapshotId: target}, wantCode: codes.NotFound, wantMsg: "base_snapshot_id"},
		{name: "base on another node", delta: &csi.GetMetadataDeltaRequest{BaseSnapshotId: sid("node-c", "monday"), TargetSnapshotId: target},
			wantCode: codes.InvalidArgument, wantMsg: "base_snapshot_id: snapshot " + sid("node-c", "monday") + " is on node node-c"},
		{name: "negative offset", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: target, StartingOffset: -1}, wantCode: codes.OutOfRange, wantMsg: "starting_offset"},
		{name: "negative count", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: target, MaxResults: -1}, wantCode: codes.InvalidArgument, wantMsg: "max_results"},
		{name: "node unreachable", alloc: &csi.GetMetadataAllocatedRequest{SnapshotId: sid("node-c", "x")}, wantCode: codes.Unavailable, wantMsg: "node-c is unreachable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.alloc != nil {
				var s csi.SnapshotMetadata_GetMetadataAllocatedClient
				if s, err = c.GetMetadataAllocated(ctx, tt.alloc); err == nil {
					_, _, err = readAll(s.Recv)
				}
			} else {
				var s csi.SnapshotMetadata_GetMetadataDeltaClient
				if s, err = c.GetMetadataDelta(ctx, tt.delta); err == nil {
					_, _, err = readAll(s.Recv)
				}
			}
			if st := status.Convert(err); st.Code() != tt.wantCode || !strings.Contains(st.Message(), tt.wantMsg) {
				t.Fatalf("got %v, want %v saying %q", err, tt.wantCode, tt.wantMsg)
			}
		})
	}
	if len(a.asked) != 0 {
		t.Errorf("the node was asked about bad input: %q", a.asked)
	}

	a.answer = func(*nodeagentv1.SnapshotBlocksRequest) ([]*nodeagentv1.SnapshotBlocksResponse, error) {
		return nil, status.Error(codes.FailedPrecondition, "base_snapshot_id: snapshot ran out of its copy-on-write space")
	}
	s, err = c.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target})
	if err == nil {
		_, _, err = readAll(s.Recv)
	}
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "node node-b: base_snapshot_id: snapshot ran out of its copy-on-write space" {
		t.Errorf("a node's refusal came back as %v", err)
	}
}

// TestMetadataRefusesLies: a node that answers with the blocks of
// another snapshot, or blocks beyond the volume, out of order, before
// the starting offset or too many per message, is refused (INTERNAL),
// counted by reason, and nothing after the lie is passed on.
func TestMetadataRefusesLies(t *testing.T) {
	base, target := sid("node-b", "monday"), sid("node-b", "tuesday")
	tests := []struct {
		name   string
		lie    func(req *nodeagentv1.SnapshotBlocksRequest, msgs []*nodeagentv1.SnapshotBlocksResponse)
		max    int32
		reason string
		msg    string
	}{
		{name: "another snapshot's blocks", lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].SnapshotId = sid("node-b", "other")
		}, reason: refusedSnapshotID, msg: "the blocks of snapshot_id"},
		{name: "against another base", lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].BaseSnapshotId = ""
		}, reason: refusedSnapshotID, msg: "against \"\""},
		{name: "beyond the volume", lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].Blocks[1].Length = 1 << 20
		}, reason: refusedBlocks, msg: "in a volume of 1048576 bytes"},
		{name: "an extent overflowing", lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].Blocks[1].Length = 1<<63 - 1
		}, reason: refusedBlocks, msg: "in a volume of"},
		{name: "an empty extent", lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].Blocks[0].Length = 0
		}, reason: refusedBlocks, msg: "extent of 0 bytes"},
		{name: "a capacity that changes", lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].VolumeCapacityBytes = 2 << 20
		}, reason: refusedBlocks, msg: "after 1048576"},
		{name: "out of order", lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].Blocks[0].Offset = 0
		}, reason: refusedBlocks, msg: "out of order or overlapping"},
		{name: "overlapping", lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].Blocks[0].Offset = 128<<10 + 32<<10
		}, reason: refusedBlocks, msg: "out of order or overlapping"},
		{name: "too many per message", max: 2, lie: func(_ *nodeagentv1.SnapshotBlocksRequest, m []*nodeagentv1.SnapshotBlocksResponse) {
			m[1].Blocks = append(m[1].Blocks, &nodeagentv1.BlockExtent{Offset: 500 << 10, Length: 4 << 10})
		}, reason: refusedBlocks, msg: "3 extents in one message, max_results 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &blockAgent{answer: func(req *nodeagentv1.SnapshotBlocksRequest) ([]*nodeagentv1.SnapshotBlocksResponse, error) {
				m, _ := honest(req)
				tt.lie(req, m)
				return m, nil
			}}
			c, r := metadataRouter(t, a)
			s, err := c.GetMetadataDelta(t.Context(), &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, MaxResults: tt.max})
			if err != nil {
				t.Fatal(err)
			}
			got, msgs, err := readAll(s.Recv)
			if st := status.Convert(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), tt.msg) || !strings.Contains(st.Message(), "node node-b answered GetMetadataDelta") {
				t.Fatalf("got %v, want INTERNAL saying %q", err, tt.msg)
			}
			if msgs != 1 || len(got) != 2 {
				t.Errorf("passed on %d messages (%v), want the first only", msgs, got)
			}
			if n := testutil.ToFloat64(r.total.WithLabelValues("node-b", tt.reason)); n != 1 {
				t.Errorf("carve_node_answers_refused_total{reason=%q} = %v, want 1", tt.reason, n)
			}
		})
	}

	t.Run("the first extent ends before starting_offset", func(t *testing.T) {
		a := &blockAgent{answer: func(req *nodeagentv1.SnapshotBlocksRequest) ([]*nodeagentv1.SnapshotBlocksResponse, error) {
			m, _ := honest(&nodeagentv1.SnapshotBlocksRequest{SnapshotId: req.GetSnapshotId()})
			return m, nil
		}}
		c, r := metadataRouter(t, a)
		s, err := c.GetMetadataAllocated(t.Context(), &csi.GetMetadataAllocatedRequest{SnapshotId: target, StartingOffset: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		if _, msgs, err := readAll(s.Recv); status.Code(err) != codes.Internal || msgs != 0 || !strings.Contains(err.Error(), "before starting_offset 65536") {
			t.Fatalf("got %v after %d messages", err, msgs)
		}
		if n := testutil.ToFloat64(r.total.WithLabelValues("node-b", refusedBlocks)); n != 1 {
			t.Errorf("refusals counted: %v", n)
		}
	})
}

// TestMetadataClientGone: a client that goes away mid-stream cancels
// the node's stream.
func TestMetadataClientGone(t *testing.T) {
	a := &blockAgent{answer: honest, hold: true, cancelled: make(chan struct{})}
	c, _ := metadataRouter(t, a)
	ctx, cancel := context.WithCancel(t.Context())
	s, err := c.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: sid("node-b", "tuesday")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-a.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the node's stream still runs 10 s after its client went away")
	}
}
