package router

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/carve-csi/carve/internal/topology"
)

// seg is node's topology segment.
func seg(node string) *csi.Topology { return &csi.Topology{Segments: topology.Segments(node)} }

// strict is what csi-provisioner --strict-topology sends for a claim whose
// selected node is node.
func strict(node string) *csi.TopologyRequirement {
	return &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(node)}, Preferred: []*csi.Topology{seg(node)}}
}

func fromSnapshot(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func fromVolume(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

var mountRWO = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

// newAgents are node-a, node-b and node-c; node-a holds vol-a and node-c
// vol-c, and only vol-a has a PV.
func newAgents() map[string]*agent {
	return map[string]*agent{
		"node-a": {name: "node-a", volumes: []string{vid("vol-a")}},
		"node-b": {name: "node-b"},
		"node-c": {name: "node-c", volumes: []string{vid("vol-c")}},
	}
}

func newRouter(t *testing.T, as map[string]*agent, pvs map[string][]string) (*Server, *callLog) {
	t.Helper()
	var list []*agent
	for _, a := range as {
		list = append(list, a)
	}
	ns, log := cluster(t, list...)
	return New(Config{Nodes: ns, Volumes: locator{pvs: pvs}, TopologyKey: topology.Key}), log
}

func TestCreateVolume(t *testing.T) {
	pvs := map[string][]string{vid("vol-a"): {"node-a"}}
	tests := []struct {
		name    string
		req     *csi.CreateVolumeRequest
		agents  func(map[string]*agent) // changes to the agents
		timeout time.Duration
		// wantNode got the CreateVolume ("": nobody).
		wantNode string
		code     codes.Code
		msg      []string
	}{
		{name: "strict topology", req: &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-b")}, wantNode: "node-b"},
		{name: "preferred only", req: &csi.CreateVolumeRequest{AccessibilityRequirements: &csi.TopologyRequirement{
			Preferred: []*csi.Topology{seg("node-c"), seg("node-a")}}}, wantNode: "node-c"},
		{name: "requisite only", req: &csi.CreateVolumeRequest{AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{seg("node-a")}}}, wantNode: "node-a"},
		{name: "segment with other keys too", req: &csi.CreateVolumeRequest{AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{{Segments: map[string]string{topology.Key: "node-b", "zone": "z1"}}}}}, wantNode: "node-b"},
		{name: "restore follows the requirement, not the snapshot's node",
			req:      &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-b"), VolumeContentSource: fromSnapshot(sid("node-a", "s"))},
			wantNode: "node-b"},
		{name: "restore without requirement goes to the snapshot's node",
			req: &csi.CreateVolumeRequest{VolumeContentSource: fromSnapshot(sid("node-c", "s"))}, wantNode: "node-c"},
		{name: "clone follows the requirement",
			req:      &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-a"), VolumeContentSource: fromVolume(vid("vol-a"))},
			wantNode: "node-a"},
		{name: "clone of a volume without PV follows the requirement: the node answers",
			req:      &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-b"), VolumeContentSource: fromVolume(vid("vol-c"))},
			wantNode: "node-b"},
		{name: "clone asked on another node than its source's PV: rescheduled, nothing sent",
			req:  &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-b"), VolumeContentSource: fromVolume(vid("vol-a"))},
			code: codes.ResourceExhausted, msg: []string{"volume " + vid("vol-a") + " lives on node node-a, not on node-b", "pin it to node-a"}},
		{name: "clone without requirement goes to the PV's node",
			req: &csi.CreateVolumeRequest{VolumeContentSource: fromVolume(vid("vol-a"))}, wantNode: "node-a"},
		{name: "clone of a volume without PV: the node that has it",
			req: &csi.CreateVolumeRequest{VolumeContentSource: fromVolume(vid("vol-c"))}, wantNode: "node-c"},

		{name: "no name", req: &csi.CreateVolumeRequest{Name: "-", AccessibilityRequirements: strict("node-a")},
			code: codes.InvalidArgument, msg: []string{"name"}},
		{name: "no topology", req: &csi.CreateVolumeRequest{},
			code: codes.InvalidArgument, msg: []string{"accessibility_requirements", topology.Key, "WaitForFirstConsumer"}},
		{name: "topology without carve's key", req: &csi.CreateVolumeRequest{AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{{Segments: map[string]string{"zone": "z1"}}}}},
			code: codes.InvalidArgument, msg: []string{"accessibility_requirements", topology.Key}},
		{name: "immediate binding: several nodes", req: &csi.CreateVolumeRequest{AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{seg("node-a"), seg("node-b")}, Preferred: []*csi.Topology{seg("node-b"), seg("node-a")}}},
			code: codes.InvalidArgument, msg: []string{"accessibility_requirements.requisite", "node-a, node-b", "WaitForFirstConsumer"}},
		{name: "preferred outside the requisite", req: &csi.CreateVolumeRequest{AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{seg("node-a")}, Preferred: []*csi.Topology{seg("node-b")}}},
			code: codes.InvalidArgument, msg: []string{"accessibility_requirements.preferred[0]", "node-b"}},
		{name: "restore from an ID that is not carve's, no requirement",
			req:  &csi.CreateVolumeRequest{VolumeContentSource: fromSnapshot("non-existing-snapshot-id")},
			code: codes.NotFound, msg: []string{"volume_content_source.snapshot.snapshot_id", "non-existing-snapshot-id"}},
		{name: "restore from an empty ID, no requirement", req: &csi.CreateVolumeRequest{VolumeContentSource: fromSnapshot("")},
			code: codes.InvalidArgument, msg: []string{"volume_content_source.snapshot.snapshot_id"}},
		{name: "clone of a volume no node has, no requirement",
			req:  &csi.CreateVolumeRequest{VolumeContentSource: fromVolume(vid("gone"))},
			code: codes.NotFound, msg: []string{"volume_content_source.volume.volume_id", vid("gone")}},

		{name: "unreachable before sending: rescheduled",
			req:  &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-x")},
			code: codes.ResourceExhausted, msg: []string{"node node-x", "unreachable", "nothing was created"}},
		{name: "restore on an unreachable node",
			req:  &csi.CreateVolumeRequest{VolumeContentSource: fromSnapshot(sid("node-x", "s"))},
			code: codes.ResourceExhausted, msg: []string{"node-x", "nothing was created"}},
		{name: "node answers UNAVAILABLE: retried on the same node",
			req: &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-a")},
			agents: func(as map[string]*agent) {
				as["node-a"].fail = map[string]error{"CreateVolume": status.Error(codes.Unavailable, "lvm busy")}
			},
			wantNode: "node-a", code: codes.Unavailable, msg: []string{"node node-a: lvm busy"}},
		{name: "connection dropped mid-call: retried on the same node",
			req:      &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-b")},
			agents:   func(as map[string]*agent) { as["node-b"].crash = map[string]bool{"CreateVolume": true} },
			wantNode: "node-b", code: codes.Unavailable, msg: []string{"node node-b"}},
		{name: "node too slow: deadline",
			req:      &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-c")},
			agents:   func(as map[string]*agent) { as["node-c"].hang = map[string]bool{"CreateVolume": true} },
			timeout:  200 * time.Millisecond,
			wantNode: "node-c", code: codes.DeadlineExceeded},
		{name: "node has no room: its own RESOURCE_EXHAUSTED",
			req: &csi.CreateVolumeRequest{AccessibilityRequirements: strict("node-a")},
			agents: func(as map[string]*agent) {
				as["node-a"].fail = map[string]error{"CreateVolume": status.Error(codes.ResourceExhausted, "no room")}
			},
			wantNode: "node-a", code: codes.ResourceExhausted, msg: []string{"node node-a: no room"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			as := newAgents()
			if tt.agents != nil {
				tt.agents(as)
			}
			r, log := newRouter(t, as, pvs)
			req := tt.req
			switch req.Name {
			case "":
				req.Name = "pvc-1"
			case "-":
				req.Name = ""
			}
			req.VolumeCapabilities = mountRWO
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			resp, err := r.CreateVolume(ctx, req)
			wantStatus(t, err, tt.code, tt.msg...)
			var want []string
			if tt.wantNode != "" {
				want = []string{tt.wantNode + " pvc-1"}
			}
			if got := log.of("CreateVolume"); !slices.Equal(got, want) {
				t.Errorf("CreateVolume went to %q, want %q", got, want)
			}
			if err == nil && topology.NodeOf(resp.GetVolume().GetAccessibleTopology()[0].GetSegments()) != tt.wantNode {
				t.Errorf("response %v is not the node's", resp)
			}
		})
	}
}

// A CreateVolume whose earlier attempt reached the node and ended in
// doubt is not moved off that node when the node cannot be reached now.
func TestCreateVolumeAfterAnAttemptInDoubt(t *testing.T) {
	as := newAgents()
	as["node-a"].hang = map[string]bool{"CreateVolume": true}
	r, _ := newRouter(t, as, nil)
	ns := r.cfg.Nodes.(*nodes)
	create := func(name string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := r.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: mountRWO, AccessibilityRequirements: strict("node-a")})
		return err
	}
	steps := []struct {
		name  string
		do    func()
		claim string
		code  codes.Code
		msg   []string
	}{
		{name: "first attempt times out on the node", claim: "pvc-1", code: codes.DeadlineExceeded},
		{name: "node gone: the claim stays", do: func() { as["node-a"].set(func() { as["node-a"].hang = nil }); ns.hide("node-a") },
			claim: "pvc-1", code: codes.Unavailable, msg: []string{"node-a", "unreachable", "earlier attempt"}},
		{name: "another claim may move", claim: "pvc-2", code: codes.ResourceExhausted, msg: []string{"nothing was created"}},
		{name: "node back: its answer settles it", do: func() { ns.unhide("node-a") }, claim: "pvc-1", code: codes.OK},
		{name: "settled: gone again may move", do: func() { ns.hide("node-a") }, claim: "pvc-1", code: codes.ResourceExhausted},
	}
	for _, st := range steps {
		if st.do != nil {
			st.do()
		}
		timeout := 30 * time.Second
		if st.code == codes.DeadlineExceeded {
			timeout = 300 * time.Millisecond // the call the node holds
		}
		err := create(st.claim, timeout)
		t.Run(st.name, func(t *testing.T) { wantStatus(t, err, st.code, st.msg...) })
	}
}

func TestPending(t *testing.T) {
	for _, tt := range []struct {
		code codes.Code
		want bool
	}{
		{codes.Unavailable, true}, {codes.DeadlineExceeded, true}, {codes.Canceled, true}, {codes.Aborted, true},
		{codes.OK, false}, {codes.ResourceExhausted, false}, {codes.Internal, false}, {codes.InvalidArgument, false},
	} {
		var p pending
		p.answered("pvc", "node-a", tt.code)
		if got := p.maybeStarted("pvc", "node-a"); got != tt.want {
			t.Errorf("after %v: maybe started = %v, want %v", tt.code, got, tt.want)
		}
		if p.maybeStarted("pvc", "node-b") || p.maybeStarted("other", "node-a") {
			t.Errorf("after %v: another node or name is pending", tt.code)
		}
		p.answered("pvc", "node-a", codes.OK)
		if p.maybeStarted("pvc", "node-a") {
			t.Errorf("after %v then OK: still pending", tt.code)
		}
	}
}

// The codes survive the hop to the sidecar: the router served over gRPC.
func TestCodesOverGRPC(t *testing.T) {
	as := newAgents()
	as["node-b"].crash = map[string]bool{"CreateVolume": true}
	r, _ := newRouter(t, as, nil)
	c := serve(t, r, &trackingListener{Listener: bufconn.Listen(1 << 20)})
	for _, tt := range []struct {
		node string
		code codes.Code
	}{
		{"node-a", codes.OK}, {"node-b", codes.Unavailable}, {"node-x", codes.ResourceExhausted},
	} {
		_, err := c.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-" + tt.node, VolumeCapabilities: mountRWO,
			AccessibilityRequirements: strict(tt.node)})
		if status.Code(err) != tt.code {
			t.Errorf("CreateVolume on %s: %v, want %v", tt.node, err, tt.code)
		}
	}
}

// TestCloneWhileTheIndexFills: a clone with a selected node is not sent
// while the PV index cannot say where its source lives: UNAVAILABLE, and
// csi-provisioner retries on the same node.
func TestCloneWhileTheIndexFills(t *testing.T) {
	ns, log := cluster(t, newAgents()["node-b"])
	r := New(Config{Nodes: ns, Volumes: locator{err: errors.New("the PersistentVolume cache has not been filled yet")}, TopologyKey: topology.Key})
	_, err := r.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: mountRWO,
		AccessibilityRequirements: strict("node-b"), VolumeContentSource: fromVolume(vid("vol-a"))})
	wantStatus(t, err, codes.Unavailable, "volume_content_source", "not known yet")
	if got := log.all(); len(got) != 0 {
		t.Errorf("calls sent: %q", got)
	}
}

// A create in doubt keeps its claim on its node for every replica and
// past a restart: the claim records the node before the call leaves
// (AnnCreateSentTo), a router with no memory of the call reads it, and
// the node's answer that it made nothing takes it off.
func TestCreateInDoubtOutlivesTheReplica(t *testing.T) {
	as := newAgents()
	as["node-a"].hang = map[string]bool{"CreateVolume": true}
	first, _ := newRouter(t, as, nil)
	ns := first.cfg.Nodes.(*nodes)
	client := fake.NewClientset(
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data-1"}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data-2"}})
	sent := ClaimAnnotations{Client: client}
	first.cfg.Sent = sent
	// A replica that restarted, or the other one: same nodes, no memory.
	second := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key, Sent: sent})
	// Only the call the node holds needs a short deadline; an answer
	// must never race one on a busy machine.
	steps := []struct {
		name   string
		do     func()
		r      *Server
		claim  string
		code   codes.Code
		msg    []string
		record string
	}{
		{name: "first attempt times out on the node", r: first, claim: "data-1", code: codes.DeadlineExceeded, record: "node-a"},
		{name: "node gone, another replica: the claim stays", do: func() { as["node-a"].set(func() { as["node-a"].hang = nil }); ns.hide("node-a") },
			r: second, claim: "data-1", code: codes.Unavailable, msg: []string{"node-a", "earlier attempt"}, record: "node-a"},
		{name: "another claim may move", r: second, claim: "data-2", code: codes.ResourceExhausted, msg: []string{"nothing was created"}},
		{name: "node back, it made nothing: the record goes", do: func() {
			ns.unhide("node-a")
			as["node-a"].set(func() {
				as["node-a"].fail = map[string]error{"CreateVolume": status.Error(codes.ResourceExhausted, "no room")}
			})
		}, r: second, claim: "data-1", code: codes.ResourceExhausted, msg: []string{"no room"}},
		{name: "settled: gone again may move", do: func() { ns.hide("node-a") }, r: first, claim: "data-1", code: codes.ResourceExhausted},
	}
	for _, st := range steps {
		if st.do != nil {
			st.do()
		}
		err := createForClaim(st.r, st.claim, st.code)
		t.Run(st.name, func(t *testing.T) {
			wantStatus(t, err, st.code, st.msg...)
			if got := recordOn(t, client, st.claim); got != st.record {
				t.Errorf("claim %s records %q, want %q", st.claim, got, st.record)
			}
		})
	}
}
