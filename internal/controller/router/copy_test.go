package router

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/topology"
)

// grantingAgent is a fake NodeAgent client of one node: it answers
// AuthorizeCopy with size bytes, or with err, and records each grant.
type grantingAgent struct {
	nodeagentv1.NodeAgentClient
	node   string
	size   int64
	err    error
	grants *[]string
}

func (g grantingAgent) AuthorizeCopy(_ context.Context, req *nodeagentv1.AuthorizeCopyRequest, _ ...grpc.CallOption) (*nodeagentv1.AuthorizeCopyResponse, error) {
	*g.grants = append(*g.grants, fmt.Sprintf("%s %s%s to %s for %s", g.node, req.GetSnapshotId(), req.GetVolumeId(), req.GetTargetNode(), req.GetTargetVolumeName()))
	if req.GetCopyId() == "" || req.GetValidSeconds() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "no copy ID or validity")
	}
	if g.err != nil {
		return nil, g.err
	}
	return &nodeagentv1.AuthorizeCopyResponse{SizeBytes: g.size, CopyPort: 9811}, nil
}

// agents is a fake Agents: node -> its answer; a node not in it is
// unreachable.
type agents struct {
	errs   map[string]error
	grants []string
}

func (a *agents) NodeAgent(_ context.Context, node string) (nodeagentv1.NodeAgentClient, error) {
	err, ok := a.errs[node]
	if !ok {
		return nil, fmt.Errorf("node %s: no connection: %w", node, ErrUnreachable)
	}
	return grantingAgent{node: node, size: 1 << 30, err: err, grants: &a.grants}, nil
}

func (a *agents) Host(node string) (string, error) { return "10.0.0." + node[len(node)-1:], nil }

// TestCreateVolumeAcrossNodes: a restore or clone on another node than
// its source's is granted by the source's node and sent with the grant
// to the asked node; the StorageClass may forbid it; a source node that
// cannot grant sends the claim back to the scheduler.
func TestCreateVolumeAcrossNodes(t *testing.T) {
	pvs := map[string][]string{vid("vol-a"): {"node-a"}}
	restore := func(node string, params map[string]string) *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: mountRWO, AccessibilityRequirements: strict(node),
			VolumeContentSource: fromSnapshot(sid("node-a", "s")), Parameters: params}
	}
	clone := func(node string, params map[string]string) *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: mountRWO, AccessibilityRequirements: strict(node),
			VolumeContentSource: fromVolume(vid("vol-a")), Parameters: params}
	}
	off := map[string]string{ParamCrossNodeCopy: "false", "carve.dev/device-class": "thin"}
	on := map[string]string{ParamCrossNodeCopy: "true", "carve.dev/device-class": "thin"}
	tests := []struct {
		name   string
		req    *csi.CreateVolumeRequest
		source error // node-a's AuthorizeCopy answer
		down   bool  // node-a's agent unreachable
		// wantGrant is node-a's grant, "" none; wantTicket what node-b's
		// CreateVolume carried ("" no CreateVolume there).
		wantGrant, wantTicket string
		code                  codes.Code
		msg                   []string
	}{
		{name: "a restore on another node", req: restore("node-b", nil),
			wantGrant: "node-a " + sid("node-a", "s") + " to node-b for pvc-1", wantTicket: "node-b 10.0.0.a:9811 1073741824"},
		{name: "a clone on another node", req: clone("node-b", on),
			wantGrant: "node-a " + vid("vol-a") + " to node-b for pvc-1", wantTicket: "node-b 10.0.0.a:9811 1073741824"},
		{name: "a restore on another node, forbidden: the node answers as before", req: restore("node-b", off),
			wantTicket: "node-b  "},
		{name: "a clone on another node, forbidden: rescheduled", req: clone("node-b", off),
			code: codes.ResourceExhausted, msg: []string{"lives on node node-a, not on node-b"}},
		{name: "a restore on its source's node needs no grant", req: &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: mountRWO,
			AccessibilityRequirements: strict("node-b"), VolumeContentSource: fromSnapshot(sid("node-b", "s")), Parameters: on},
			wantTicket: "node-b  "},
		{name: "a source node that copies to no other node", req: restore("node-b", nil), source: status.Error(codes.Unimplemented, "no copies"),
			wantGrant: "node-a " + sid("node-a", "s") + " to node-b for pvc-1", code: codes.ResourceExhausted, msg: []string{"lives on node node-a, not on node-b", "copies its volumes to no other node", "pin it to node-a"}},
		{name: "a source node that cannot be reached", req: clone("node-b", nil), down: true,
			code: codes.ResourceExhausted, msg: []string{"lives on node node-a", "cannot be reached"}},
		{name: "a source its node does not have: the target answers", req: restore("node-b", nil), source: status.Error(codes.NotFound, "gone"),
			wantGrant: "node-a " + sid("node-a", "s") + " to node-b for pvc-1", wantTicket: "node-b  "},
		{name: "a source that cannot be read", req: restore("node-b", nil), source: status.Error(codes.FailedPrecondition, "ran out of space"),
			wantGrant: "node-a " + sid("node-a", "s") + " to node-b for pvc-1", code: codes.FailedPrecondition, msg: []string{"node node-a: ran out of space"}},
		{name: "a parameter that is no boolean", req: restore("node-b", map[string]string{ParamCrossNodeCopy: "sometimes"}),
			code: codes.InvalidArgument, msg: []string{ParamCrossNodeCopy, "sometimes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns, log := cluster(t, &agent{name: "node-a"}, &agent{name: "node-b"})
			ag := &agents{errs: map[string]error{"node-a": tt.source, "node-b": nil}}
			if tt.down {
				delete(ag.errs, "node-a")
			}
			s := New(Config{Nodes: ns, Volumes: locator{pvs: pvs}, TopologyKey: topology.Key, Agents: ag})
			_, err := s.CreateVolume(t.Context(), tt.req)
			if tt.code != codes.OK {
				wantStatus(t, err, tt.code, tt.msg...)
			} else if err != nil {
				t.Fatal(err)
			}
			var wantGrants []string
			if tt.wantGrant != "" {
				wantGrants = []string{tt.wantGrant}
			}
			if !slices.Equal(ag.grants, wantGrants) {
				t.Errorf("grants %q, want %q", ag.grants, wantGrants)
			}
			var wantTickets []string
			if tt.wantTicket != "" {
				wantTickets = []string{tt.wantTicket}
			}
			if got := log.of("Ticket"); !slices.Equal(got, wantTickets) {
				t.Errorf("CreateVolume tickets %q, want %q", got, wantTickets)
			}
			for _, p := range log.of("Parameters") {
				if p != "node-b carve.dev/device-class" && p != "node-b " {
					t.Errorf("parameters sent: %q, want no %s", p, ParamCrossNodeCopy)
				}
			}
		})
	}
}

// TestRepeatOfARunningCopyNeedsNoGrant: the repeats of a CreateVolume
// whose copy still runs on the target (its first call cut short) are
// sent without a new grant, which the target would leave unread; once
// the target says no copy runs, the same call is granted anew.
func TestRepeatOfARunningCopyNeedsNoGrant(t *testing.T) {
	const ticket, none = "node-b 10.0.0.a:9811 1073741824", "node-b  "
	busy := withReason(codes.Aborted, moveapi.ErrorCopyInProgress, "its data is still being copied into it")
	grant := "node-a " + sid("node-a", "s") + " to node-b for pvc-1"
	type step struct {
		// fail is node-b's answer to every CreateVolume, unticketed
		// to one without a ticket; nil answers the volume.
		fail, unticketed error
		code             codes.Code
		// grants and tickets are those of this step's call.
		grants, tickets []string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "a copy cut short and still running, then done", steps: []step{
			{fail: status.Error(codes.DeadlineExceeded, "deadline"), code: codes.DeadlineExceeded, grants: []string{grant}, tickets: []string{ticket}},
			{fail: busy, code: codes.Aborted, tickets: []string{none}},
			{fail: busy, code: codes.Aborted, tickets: []string{none}},
			{tickets: []string{none}},
			// A new call of the name, once made: granted as a first call.
			{grants: []string{grant}, tickets: []string{ticket}},
		}},
		{name: "the target answers that the copy runs", steps: []step{
			{fail: busy, code: codes.Aborted, grants: []string{grant}, tickets: []string{ticket}},
			{fail: busy, code: codes.Aborted, tickets: []string{none}},
		}},
		{name: "the copy ended unfinished: granted in the same call", steps: []step{
			{fail: status.Error(codes.Unavailable, "connection replaced"), code: codes.Unavailable, grants: []string{grant}, tickets: []string{ticket}},
			{unticketed: status.Error(codes.FailedPrecondition, "still to be copied, its source cannot be read"), grants: []string{grant}, tickets: []string{none, ticket}},
			{grants: []string{grant}, tickets: []string{ticket}},
		}},
		{name: "a definite failure is granted anew on the next call", steps: []step{
			{fail: status.Error(codes.Internal, "copy failed"), code: codes.Internal, grants: []string{grant}, tickets: []string{ticket}},
			{grants: []string{grant}, tickets: []string{ticket}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &agent{name: "node-b"}
			ns, log := cluster(t, &agent{name: "node-a"}, b)
			ag := &agents{errs: map[string]error{"node-a": nil, "node-b": nil}}
			s := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key, Agents: ag})
			for i, st := range tt.steps {
				b.set(func() {
					b.fail = map[string]error{"CreateVolume": st.fail, "CreateVolume without a ticket": st.unticketed}
				})
				grants, tickets := len(ag.grants), len(log.inOrder("Ticket"))
				_, err := s.CreateVolume(t.Context(), &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: mountRWO,
					AccessibilityRequirements: strict("node-b"), VolumeContentSource: fromSnapshot(sid("node-a", "s"))})
				if got := status.Code(err); got != st.code {
					t.Fatalf("call %d: %v, want code %s", i+1, err, st.code)
				}
				if got := ag.grants[grants:]; !slices.Equal(got, st.grants) {
					t.Errorf("call %d: grants %q, want %q", i+1, got, st.grants)
				}
				if got := log.inOrder("Ticket")[tickets:]; !slices.Equal(got, st.tickets) {
					t.Errorf("call %d: CreateVolume tickets %q, want %q", i+1, got, st.tickets)
				}
			}
		})
	}
}
