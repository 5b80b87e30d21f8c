package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

// volumeCalls are the calls routed by the volume's node: each sends id.
var volumeCalls = map[string]func(ctx context.Context, r *Server, id string) error{
	"DeleteVolume": func(ctx context.Context, r *Server, id string) error {
		_, err := r.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	},
	"ValidateVolumeCapabilities": func(ctx context.Context, r *Server, id string) error {
		_, err := r.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: mountRWO})
		return err
	},
	"ControllerGetVolume": func(ctx context.Context, r *Server, id string) error {
		_, err := r.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
		return err
	},
	"ControllerGetVolumeHealth": func(ctx context.Context, r *Server, id string) error {
		_, err := r.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		return err
	},
	"CreateSnapshot": func(ctx context.Context, r *Server, id string) error {
		_, err := r.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: id})
		return err
	},
	"ControllerModifyVolume": func(ctx context.Context, r *Server, id string) error {
		_, err := r.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
			MutableParameters: map[string]string{volume.ParamWriteBytesPerSecond: "10Mi"}})
		return err
	},
}

// field is the request field that carries a call's volume ID.
func field(method string) string {
	if method == "CreateSnapshot" {
		return "source_volume_id"
	}
	return "volume_id"
}

func TestVolumeCalls(t *testing.T) {
	tests := []struct {
		name   string
		id     string
		pvs    map[string][]string
		pvErr  error
		agents func(map[string]*agent)
		listed []string // names Names reports with no connection
		// wantNode got the call ("": nobody, beyond the lookup).
		wantNode string
		code     codes.Code
		// deleteOK: DeleteVolume succeeds where the others fail with code.
		deleteOK bool
		msg      []string
	}{
		{name: "by its PV", id: vid("vol-a"), pvs: map[string][]string{vid("vol-a"): {"node-a"}}, wantNode: "node-a"},
		{name: "PV index wrong: the node's answer", id: vid("vol-a"), pvs: map[string][]string{vid("vol-a"): {"node-b"}},
			wantNode: "node-b", code: codes.NotFound, deleteOK: true, msg: []string{"node node-b"}},
		{name: "no PV: the node that has it", id: vid("vol-c"), wantNode: "node-c"},
		{name: "PV pinned to no node: the node that has it", id: vid("vol-c"), pvs: map[string][]string{vid("vol-c"): {""}}, wantNode: "node-c"},
		{name: "no node has it", id: vid("gone"), code: codes.NotFound, deleteOK: true, msg: []string{vid("gone"), "does not exist"}},
		{name: "not a carve ID", id: "reallyfakevolumeid", code: codes.NotFound, deleteOK: true, msg: []string{"reallyfakevolumeid"}},
		{name: "empty ID", id: "", code: codes.InvalidArgument, msg: []string{"must be set"}},
		{name: "two nodes have it", id: vid("vol-c"),
			agents: func(as map[string]*agent) { as["node-b"].volumes = []string{vid("vol-c")} },
			code:   codes.Internal, msg: []string{"node-b, node-c"}},
		{name: "PVs on two nodes", id: vid("vol-a"), pvs: map[string][]string{vid("vol-a"): {"node-a", "node-b"}},
			code: codes.Internal, msg: []string{"node-a, node-b"}},
		{name: "index not filled", id: vid("vol-a"), pvErr: errors.New("not synced"),
			code: codes.Unavailable, msg: []string{"not synced"}},
		{name: "its node unreachable", id: vid("vol-a"), pvs: map[string][]string{vid("vol-a"): {"node-x"}},
			code: codes.Unavailable, msg: []string{"node node-x", "unreachable", "nothing was sent"}},
		{name: "a node that does not answer may have it", id: vid("gone"),
			agents: func(as map[string]*agent) {
				as["node-b"].fail = map[string]error{"ValidateVolumeCapabilities": status.Error(codes.Unavailable, "restarting")}
			},
			code: codes.Unavailable, msg: []string{"node-b", "restarting"}},
		{name: "a node lost between listing and asking may have it", id: vid("gone"), listed: []string{"node-x"},
			code: codes.Unavailable, msg: []string{"node-x"}},
		{name: "found although another node failed", id: vid("vol-c"),
			agents: func(as map[string]*agent) {
				as["node-b"].fail = map[string]error{"ValidateVolumeCapabilities": status.Error(codes.Unavailable, "restarting")}
			},
			wantNode: "node-c"},
		{name: "the node fails the call", id: vid("vol-a"), pvs: map[string][]string{vid("vol-a"): {"node-a"}},
			agents: func(as map[string]*agent) {
				as["node-a"].fail = map[string]error{}
				for m := range volumeCalls {
					as["node-a"].fail[m] = status.Error(codes.FailedPrecondition, "in use")
				}
			},
			wantNode: "node-a", code: codes.FailedPrecondition, msg: []string{"node node-a: in use"}},
		{name: "connection dropped mid-call", id: vid("vol-a"), pvs: map[string][]string{vid("vol-a"): {"node-a"}},
			agents: func(as map[string]*agent) {
				as["node-a"].crash = map[string]bool{}
				for m := range volumeCalls {
					as["node-a"].crash[m] = true
				}
			},
			wantNode: "node-a", code: codes.Unavailable, msg: []string{"node node-a"}},
	}
	for method, call := range volumeCalls {
		for _, tt := range tests {
			t.Run(method+"/"+tt.name, func(t *testing.T) {
				as := newAgents()
				if tt.agents != nil {
					tt.agents(as)
				}
				var list []*agent
				for _, a := range as {
					list = append(list, a)
				}
				ns, log := cluster(t, list...)
				ns.listed = tt.listed
				r := New(Config{Nodes: ns, Volumes: locator{pvs: tt.pvs, err: tt.pvErr}, TopologyKey: topology.Key})
				err := call(context.Background(), r, tt.id)
				code, msg := tt.code, tt.msg
				if method == "DeleteVolume" && tt.deleteOK {
					code, msg = codes.OK, nil
				}
				if code == codes.InvalidArgument {
					msg = append(msg, field(method))
				}
				if code == codes.NotFound && tt.wantNode == "" {
					msg = append(msg, field(method))
				}
				wantStatus(t, err, code, msg...)
				var want []string
				if tt.wantNode != "" {
					want = []string{tt.wantNode + " " + tt.id}
				}
				if method != "ValidateVolumeCapabilities" {
					if got := log.of(method); !slices.Equal(got, want) {
						t.Errorf("%s went to %q, want %q", method, got, want)
					}
				}
			})
		}
	}
}

func TestAskNodesAtMostSixteenAtOnce(t *testing.T) {
	var list []*agent
	for i := range 40 {
		list = append(list, &agent{name: fmt.Sprintf("node-%02d", i)})
	}
	list[33].volumes = []string{vid("v")}
	ns, log := cluster(t, list...)
	slow := &slowNodes{nodes: ns, delay: 5 * time.Millisecond}
	r := New(Config{Nodes: slow, Volumes: locator{}, TopologyKey: topology.Key})
	if _, err := r.ControllerGetVolume(context.Background(), &csi.ControllerGetVolumeRequest{VolumeId: vid("v")}); err != nil {
		t.Fatal(err)
	}
	if got := len(log.of("ValidateVolumeCapabilities")); got != 40 {
		t.Errorf("asked %d nodes, want 40", got)
	}
	if got := slow.maxSeen.Load(); got > askAtOnce || got < 2 {
		t.Errorf("at most %d asked at once, want 2..%d", got, askAtOnce)
	}
	if got := log.of("ControllerGetVolume"); !slices.Equal(got, []string{"node-33 " + vid("v")}) {
		t.Errorf("ControllerGetVolume went to %q", got)
	}
}

// slowNodes counts the lookups under way, each held for delay so that
// they overlap.
type slowNodes struct {
	*nodes
	delay             time.Duration
	inFlight, maxSeen atomic.Int32
}

func (s *slowNodes) Controller(ctx context.Context, node string) (csi.ControllerClient, error) {
	n := s.inFlight.Add(1)
	for m := s.maxSeen.Load(); n > m && !s.maxSeen.CompareAndSwap(m, n); m = s.maxSeen.Load() {
	}
	time.Sleep(s.delay)
	s.inFlight.Add(-1)
	return s.nodes.Controller(ctx, node)
}

func TestSnapshotCalls(t *testing.T) {
	calls := map[string]func(ctx context.Context, r *Server, id string) error{
		"DeleteSnapshot": func(ctx context.Context, r *Server, id string) error {
			_, err := r.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id})
			return err
		},
		"GetSnapshot": func(ctx context.Context, r *Server, id string) error {
			_, err := r.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: id})
			return err
		},
	}
	tests := []struct {
		name     string
		id       string
		wantNode string
		code     codes.Code
		deleteOK bool
		msg      []string
	}{
		{name: "the node in the ID", id: sid("node-b", "s"), wantNode: "node-b"},
		{name: "unreachable", id: sid("node-x", "s"), code: codes.Unavailable, msg: []string{"node node-x", "nothing was sent"}},
		{name: "not a carve ID", id: "reallyfakesnapshotid", code: codes.NotFound, deleteOK: true, msg: []string{"snapshot_id", "reallyfakesnapshotid"}},
		{name: "empty", id: "", code: codes.InvalidArgument, msg: []string{"snapshot_id: must be set"}},
	}
	for method, call := range calls {
		for _, tt := range tests {
			t.Run(method+"/"+tt.name, func(t *testing.T) {
				r, log := newRouter(t, newAgents(), nil)
				code, msg := tt.code, tt.msg
				if method == "DeleteSnapshot" && tt.deleteOK {
					code, msg = codes.OK, nil
				}
				wantStatus(t, call(context.Background(), r, tt.id), code, msg...)
				var want []string
				if tt.wantNode != "" {
					want = []string{tt.wantNode + " " + tt.id}
				}
				if got := log.all(); !slices.Equal(got, prefixed(want, method)) {
					t.Errorf("calls %q, want %q", got, prefixed(want, method))
				}
			})
		}
	}
}

// prefixed turns "node id" into "node method id".
func prefixed(calls []string, method string) []string {
	var out []string
	for _, c := range calls {
		n, id, _ := strings.Cut(c, " ")
		out = append(out, n+" "+method+" "+id)
	}
	return out
}

func TestCapabilities(t *testing.T) {
	r := New(Config{})
	resp, err := r.ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := csiserver.ControllerCapabilities(
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	)
	if !proto.Equal(resp, want) {
		t.Errorf("capabilities %v, want %v", resp, want)
	}
	// What is not advertised is not served.
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"GetCapacity": func() error { _, err := r.GetCapacity(ctx, &csi.GetCapacityRequest{}); return err },
		"ControllerExpandVolume": func() error {
			_, err := r.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vid("a")})
			return err
		},
		"ControllerPublishVolume": func() error {
			_, err := r.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: vid("a")})
			return err
		},
	} {
		if code := status.Code(call()); code != codes.Unimplemented {
			t.Errorf("%s: code %v, want Unimplemented", name, code)
		}
	}
}

// The PV index is the Locator main hands the router.
var _ Locator = (*pvindex.Index)(nil)

// A mutable parameter that is no limit is refused before any node is
// asked, naming the parameter and the values allowed.
func TestModifyVolumeRefusesWhatIsNoLimit(t *testing.T) {
	ns, calls := cluster(t, &agent{name: "node-a", volumes: []string{vid("vol-a")}})
	r := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key})
	for _, tc := range []struct {
		params map[string]string
		want   []string
	}{
		{map[string]string{"XXX_FakeKey": "x"}, []string{"XXX_FakeKey", "not a mutable parameter", volume.ParamWriteIOPS}},
		{map[string]string{volume.ParamWriteBytesPerSecond: "fast"}, []string{volume.ParamWriteBytesPerSecond, `"fast"`, "allowed"}},
		{map[string]string{volume.ParamReadIOPS: "-3"}, []string{volume.ParamReadIOPS, "whole number"}},
	} {
		_, err := r.ControllerModifyVolume(context.Background(), &csi.ControllerModifyVolumeRequest{VolumeId: vid("vol-a"), MutableParameters: tc.params})
		wantStatus(t, err, codes.InvalidArgument, tc.want...)
	}
	if got := calls.of("ControllerModifyVolume"); len(got) != 0 {
		t.Errorf("refused modifies reached nodes: %v", got)
	}
}
