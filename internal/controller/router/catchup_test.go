package router

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/reason"
	"github.com/carve-csi/carve/internal/topology"
)

// catchUpAgent is a fake NodeAgent client of one node for catch-ups: it
// answers AuthorizeCopy and CatchUpCopy with err (by method) and
// records each call.
type catchUpAgent struct {
	nodeagentv1.NodeAgentClient
	node  string
	errs  map[string]error
	calls *[]string
}

func (g catchUpAgent) AuthorizeCopy(_ context.Context, req *nodeagentv1.AuthorizeCopyRequest, _ ...grpc.CallOption) (*nodeagentv1.AuthorizeCopyResponse, error) {
	*g.calls = append(*g.calls, fmt.Sprintf("%s AuthorizeCopy %s base %s to %s", g.node, req.GetVolumeId(), req.GetBaseSnapshotId(), req.GetTargetNode()))
	if req.GetCopyId() == "" || req.GetValidSeconds() <= 0 || req.GetSnapshotId() != "" || req.GetTargetVolumeName() == "" {
		return nil, status.Errorf(codes.InvalidArgument, "a malformed grant %v", req)
	}
	if err := g.errs["AuthorizeCopy"]; err != nil {
		return nil, err
	}
	return &nodeagentv1.AuthorizeCopyResponse{SizeBytes: 1 << 30, CopyPort: 9811}, nil
}

func (g catchUpAgent) CatchUpCopy(_ context.Context, req *nodeagentv1.CatchUpCopyRequest, _ ...grpc.CallOption) (*nodeagentv1.CatchUpCopyResponse, error) {
	*g.calls = append(*g.calls, fmt.Sprintf("%s CatchUpCopy %s from %s on %s at %s base %s size %d", g.node, req.GetTargetVolumeId(),
		req.GetSourceVolumeId(), req.GetSourceNode(), req.GetSourceAddress(), req.GetBaseSnapshotId(), req.GetSizeBytes()))
	if req.GetCopyId() == "" {
		return nil, status.Error(codes.InvalidArgument, "no copy ID")
	}
	if err := g.errs["CatchUpCopy"]; err != nil {
		return nil, err
	}
	return &nodeagentv1.CatchUpCopyResponse{ReceivedBytes: 8 << 20}, nil
}

// catchUpAgents is a fake Agents: node -> its errors; a node not in it
// is unreachable.
type catchUpAgents struct {
	errs  map[string]map[string]error
	calls []string
}

func (a *catchUpAgents) NodeAgent(_ context.Context, node string) (nodeagentv1.NodeAgentClient, error) {
	errs, ok := a.errs[node]
	if !ok {
		return nil, fmt.Errorf("node %s: no connection: %w", node, ErrUnreachable)
	}
	return catchUpAgent{node: node, errs: errs, calls: &a.calls}, nil
}

func (a *catchUpAgents) Host(node string) (string, error) { return "10.0.0." + node[len(node)-1:], nil }

// TestCatchUpCopy: the router finds the source's node from the base
// snapshot (checked against the volume's PV) and takes the target's node
// from the caller, asking no other node about the target (node-c claims
// to have it too, and is never asked); it grants the delta on the source and has the target read it;
// each refusal names the volumes and nodes and keeps the agents' codes.
func TestCatchUpCopy(t *testing.T) {
	src, dst, base := vid("vol-a"), vid("vol-b"), sid("node-a", "seed")
	grant := "node-a AuthorizeCopy " + src + " base " + base + " to node-b"
	catchUp := "node-b CatchUpCopy " + dst + " from " + src + " on node-a at 10.0.0.a:9811 base " + base + " size 1073741824"
	tests := []struct {
		name           string
		src, base, dst string
		// to is the target's node (default node-b).
		to        string
		pvs       map[string][]string
		errs      map[string]map[string]error // nil: both nodes answer
		wantCalls []string
		code      codes.Code
		msg       []string
		// reason: the ErrorInfo reason the agent's answer carried, kept.
		reason string
	}{
		{name: "caught up", src: src, base: base, dst: dst, wantCalls: []string{grant, catchUp}},
		{name: "the target found through its PV", src: src, base: base, dst: dst,
			pvs: map[string][]string{src: {"node-a"}, dst: {"node-b"}}, wantCalls: []string{grant, catchUp}},
		{name: "no base", src: src, dst: dst, code: codes.InvalidArgument, msg: []string{"base snapshot ID must be set"}},
		{name: "a malformed base", src: src, base: "nonsense", dst: dst, code: codes.InvalidArgument, msg: []string{"nonsense"}},
		{name: "a malformed target", src: src, base: base, dst: "nonsense", code: codes.InvalidArgument, msg: []string{"nonsense"}},
		{name: "the target's node not in the pool", src: src, base: base, dst: dst, to: "node-x",
			code: codes.Unavailable, msg: []string{"node node-x is unreachable"}},
		{name: "no target node", src: src, base: base, dst: dst, to: "-", code: codes.InvalidArgument, msg: []string{"target node must be set"}},
		{name: "a base of another node than the source", src: src, base: sid("node-b", "seed"), dst: dst,
			code: codes.FailedPrecondition, msg: []string{"source volume " + src + " is on node node-a", "on node node-b"}},
		{name: "source and target on one node", src: src, base: base, dst: src, to: "node-a",
			code: codes.FailedPrecondition, msg: []string{"both on node node-a"}},
		{name: "a source still open", src: src, base: base, dst: dst,
			errs:      map[string]map[string]error{"node-a": {"AuthorizeCopy": status.Error(codes.FailedPrecondition, "volume is open")}, "node-b": nil},
			wantCalls: []string{grant}, code: codes.FailedPrecondition, msg: []string{"granting the catch-up of " + src, "node node-a: volume is open"}},
		{name: "a base that overflowed", src: src, base: base, dst: dst,
			errs:      map[string]map[string]error{"node-a": {"AuthorizeCopy": refusal(moveapi.ErrorBaseOverflowed, "base ran out")}, "node-b": nil},
			wantCalls: []string{grant}, code: codes.FailedPrecondition, msg: []string{"node node-a: base ran out"}, reason: moveapi.ErrorBaseOverflowed},
		{name: "a target of another size", src: src, base: base, dst: dst,
			errs:      map[string]map[string]error{"node-a": nil, "node-b": {"CatchUpCopy": refusal(moveapi.ErrorSizeMismatch, "has 2 bytes")}},
			wantCalls: []string{grant, catchUp}, code: codes.FailedPrecondition, msg: []string{"node node-b: has 2 bytes"}, reason: moveapi.ErrorSizeMismatch},
		{name: "a source agent that serves no catch-ups", src: src, base: base, dst: dst,
			errs:      map[string]map[string]error{"node-a": {"AuthorizeCopy": status.Error(codes.Unimplemented, "no catch-ups")}, "node-b": nil},
			wantCalls: []string{grant}, code: codes.Unimplemented, msg: []string{"node node-a"}},
		{name: "a target that did not check out", src: src, base: base, dst: dst,
			errs:      map[string]map[string]error{"node-a": nil, "node-b": {"CatchUpCopy": status.Error(codes.DataLoss, "digest mismatch")}},
			wantCalls: []string{grant, catchUp}, code: codes.DataLoss, msg: []string{"catching up " + dst + " from " + src + " on node node-a", "node node-b: digest mismatch"}},
		{name: "the target's agent unreachable", src: src, base: base, dst: dst,
			errs: map[string]map[string]error{"node-a": nil}, code: codes.Unavailable, msg: []string{"node node-b is unreachable"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns, log := cluster(t, &agent{name: "node-a", volumes: []string{src}}, &agent{name: "node-b", volumes: []string{dst}},
				&agent{name: "node-c", volumes: []string{dst}})
			ag := &catchUpAgents{errs: tt.errs}
			if ag.errs == nil {
				ag.errs = map[string]map[string]error{"node-a": nil, "node-b": nil}
			}
			pvs := tt.pvs
			if pvs == nil {
				pvs = map[string][]string{src: {"node-a"}}
			}
			s := New(Config{Nodes: ns, Volumes: locator{pvs: pvs}, TopologyKey: topology.Key, Agents: ag})
			to := tt.to
			switch to {
			case "":
				to = "node-b"
			case "-":
				to = ""
			}
			got, err := s.CatchUpCopy(t.Context(), tt.src, tt.base, to, tt.dst)
			if tt.code != codes.OK {
				wantStatus(t, err, tt.code, tt.msg...)
				if r := reason.Of(err); r != tt.reason {
					t.Errorf("reason %q, want %q", r, tt.reason)
				}
			} else if err != nil || got != 8<<20 {
				t.Fatalf("CatchUpCopy: %d, %v", got, err)
			}
			if !slices.Equal(ag.calls, tt.wantCalls) {
				t.Errorf("calls %q, want %q", ag.calls, tt.wantCalls)
			}
			for _, c := range log.all() {
				if strings.Contains(c, tt.dst) {
					t.Errorf("a node was asked about the target: %s", c)
				}
			}
		})
	}
}

// refusal is an agent's FAILED_PRECONDITION with an ErrorInfo reason.
func refusal(why, msg string) error { return withReason(codes.FailedPrecondition, why, msg) }

// withReason is an agent's answer of code with an ErrorInfo reason.
func withReason(code codes.Code, why, msg string) error {
	st, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: why, Domain: moveapi.ErrorDomain})
	if err != nil {
		panic(err)
	}
	return st.Err()
}
