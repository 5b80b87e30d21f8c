package router

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

// agent is a fake node agent's Controller service: it holds volume and
// snapshot IDs, records every call it gets, and fails as told.
type agent struct {
	csi.UnimplementedControllerServer
	name      string
	volumes   []string // volume IDs, sorted
	snapshots []string // snapshot IDs, sorted
	// fail is the error a method returns, by method name.
	fail map[string]error
	// crash, by method name: the agent drops its connections mid-call.
	crash map[string]bool
	// hang, by method name: the call blocks until the caller gives up.
	hang map[string]bool
	// tamper, when set, changes each answer before it is sent: a node
	// that lies.
	tamper func(method string, resp any)

	log *callLog
	lis *trackingListener
	mu  sync.Mutex // guards fail, crash and hang once serving
}

// set changes how the agent answers while it serves.
func (a *agent) set(change func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	change()
}

// callLog records "node Method id" for every call any agent got.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(node, method, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, node+" "+method+" "+id)
}

// of lists the calls of method, as "node id", sorted.
func (l *callLog) of(method string) []string {
	out := l.inOrder(method)
	slices.Sort(out)
	return out
}

// inOrder is "node id" of every call of method, in the order made.
func (l *callLog) inOrder(method string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, c := range l.calls {
		if n, rest, _ := strings.Cut(c, " "); strings.HasPrefix(rest, method+" ") {
			out = append(out, n+" "+strings.TrimPrefix(rest, method+" "))
		}
	}
	return out
}

func (l *callLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// trackingListener remembers the server side of each connection, so that
// a test can drop them mid-call.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) dropAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close() // the point is to break the call
	}
}

// serve runs the fake call of method on id: it records it, then fails,
// crashes or hangs as told; ok is true when it should answer normally.
func (a *agent) serve(ctx context.Context, method, id string) (bool, error) {
	a.log.add(a.name, method, id)
	a.mu.Lock()
	crash, hang, fail := a.crash[method], a.hang[method], a.fail[method]
	a.mu.Unlock()
	switch {
	case crash:
		a.lis.dropAll()
		<-ctx.Done()
		return false, ctx.Err()
	case hang:
		<-ctx.Done()
		return false, ctx.Err()
	case fail != nil:
		return false, fail
	}
	return true, nil
}

// answer is resp as the agent sends it: tampered with, when told to.
func answer[R any](a *agent, method string, resp R) R {
	a.mu.Lock()
	tamper := a.tamper
	a.mu.Unlock()
	if tamper != nil {
		tamper(method, resp)
	}
	return resp
}

// failUnticketed tells whether a CreateVolume that carries no copy
// ticket is answered as told for "CreateVolume without a ticket".
func (a *agent) failUnticketed(ticket string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.TrimSpace(ticket) == "" && a.fail["CreateVolume without a ticket"] != nil
}

// serveVolume is serve for a call on volume id, which must be one of the
// agent's: NOT_FOUND otherwise.
func (a *agent) serveVolume(ctx context.Context, method, id string) error {
	if ok, err := a.serve(ctx, method, id); !ok {
		return err
	}
	if !a.has(id) {
		return a.notFound(id)
	}
	return nil
}

// onVolume is resp, the answer of method on volume id, unless serveVolume
// fails the call.
func onVolume[R any](ctx context.Context, a *agent, method, id string, resp R) (R, error) {
	if err := a.serveVolume(ctx, method, id); err != nil {
		var none R
		return none, err
	}
	return resp, nil
}

func (a *agent) has(id string) bool { return slices.Contains(a.volumes, id) }

func (a *agent) notFound(id string) error {
	return status.Errorf(codes.NotFound, "volume %s does not exist on %s", id, a.name)
}

func (a *agent) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	// What a copy across nodes adds: the grant's ticket, the parameters.
	ticket := strings.Join(metadata.ValueFromIncomingContext(ctx, "carve-copy-source-address"), ",") + " " +
		strings.Join(metadata.ValueFromIncomingContext(ctx, "carve-copy-source-size"), ",")
	a.log.add(a.name, "Ticket", ticket)
	a.log.add(a.name, "Parameters", strings.Join(slices.Sorted(maps.Keys(req.GetParameters())), ","))
	method := "CreateVolume"
	if a.failUnticketed(ticket) {
		method = "CreateVolume without a ticket"
	}
	if ok, err := a.serve(ctx, method, req.GetName()); !ok {
		return nil, err
	}
	vc := map[string]string{volume.ContextVolumeName: req.GetName()}
	if id := req.GetSecrets()[volume.SecretKeyID]; id != "" {
		// What a node does with an encrypted volume's key: its key ID
		// goes into the volume context.
		vc[volume.ContextKeyID] = id
		a.log.add(a.name, "Secrets", strings.Join(slices.Sorted(maps.Keys(req.GetSecrets())), ","))
	}
	return answer(a, "CreateVolume", &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: volume.VolumeID("vg0", volume.LVNameFor(req.GetName())),
		VolumeContext:      vc,
		AccessibleTopology: []*csi.Topology{&csi.Topology{Segments: topology.Segments(a.name)}}}}), nil
}

func (a *agent) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if ok, err := a.serve(ctx, "DeleteVolume", req.GetVolumeId()); !ok {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (a *agent) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	return onVolume(ctx, a, "ValidateVolumeCapabilities", req.GetVolumeId(), &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeCapabilities: req.GetVolumeCapabilities()}})
}

func (a *agent) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	return onVolume(ctx, a, "ControllerGetVolume", req.GetVolumeId(), &csi.ControllerGetVolumeResponse{Volume: &csi.Volume{VolumeId: req.GetVolumeId()}})
}

func (a *agent) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	return onVolume(ctx, a, "ControllerModifyVolume", req.GetVolumeId(), &csi.ControllerModifyVolumeResponse{})
}

func (a *agent) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	return onVolume(ctx, a, "ControllerGetVolumeHealth", req.GetVolumeId(), &csi.ControllerGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: req.GetVolumeId()}})
}

func (a *agent) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := a.serveVolume(ctx, "CreateSnapshot", req.GetSourceVolumeId()); err != nil {
		return nil, err
	}
	return answer(a, "CreateSnapshot", &csi.CreateSnapshotResponse{Snapshot: &csi.Snapshot{SourceVolumeId: req.GetSourceVolumeId(),
		SnapshotId: volume.SnapshotID(a.name, "vg0", volume.SnapshotLVNameFor(req.GetName()))}}), nil
}

func (a *agent) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if ok, err := a.serve(ctx, "DeleteSnapshot", req.GetSnapshotId()); !ok {
		return nil, err
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (a *agent) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if ok, err := a.serve(ctx, "GetSnapshot", req.GetSnapshotId()); !ok {
		return nil, err
	}
	return answer(a, "GetSnapshot", &csi.GetSnapshotResponse{Snapshot: &csi.Snapshot{SnapshotId: req.GetSnapshotId()}}), nil
}

// page lists ids after token, at most limit (0: all); the token is the last
// ID of the page, as the node agent's.
func page(ids []string, token string, limit int32) ([]string, string) {
	var out []string
	for _, id := range ids {
		if token != "" && id <= token {
			continue
		}
		if limit > 0 && len(out) == int(limit) {
			return out, out[len(out)-1]
		}
		out = append(out, id)
	}
	return out, ""
}

func (a *agent) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if ok, err := a.serve(ctx, "ListVolumes", req.GetStartingToken()); !ok {
		return nil, err
	}
	ids, next := page(a.volumes, req.GetStartingToken(), req.GetMaxEntries())
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, id := range ids {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: &csi.Volume{VolumeId: id,
			AccessibleTopology: []*csi.Topology{&csi.Topology{Segments: topology.Segments(a.name)}}}})
	}
	return answer(a, "ListVolumes", resp), nil
}

func (a *agent) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	if ok, err := a.serve(ctx, "ControllerListVolumeHealth", req.GetStartingToken()); !ok {
		return nil, err
	}
	ids, next := page(a.volumes, req.GetStartingToken(), req.GetMaxEntries())
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, id := range ids {
		resp.Entries = append(resp.Entries, &csi.VolumeHealth{VolumeId: id})
	}
	return resp, nil
}

func (a *agent) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if ok, err := a.serve(ctx, "ListSnapshots", req.GetStartingToken()); !ok {
		return nil, err
	}
	var ids []string
	for _, id := range a.snapshots {
		if req.GetSnapshotId() == "" || req.GetSnapshotId() == id {
			ids = append(ids, id)
		}
	}
	ids, next := page(ids, req.GetStartingToken(), req.GetMaxEntries())
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, id := range ids {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: &csi.Snapshot{SnapshotId: id}})
	}
	return answer(a, "ListSnapshots", resp), nil
}

// nodes is a fake Nodes over the agents, each a real gRPC server on an
// in-memory listener. Names lists the connected agents; listed are names
// that Names reports but Controller refuses (an agent lost in between).
type nodes struct {
	clients map[string]csi.ControllerClient
	listed  []string
	hidden  map[string]csi.ControllerClient
}

// hide takes node's agent off the connected ones; unhide brings it back.
func (n *nodes) hide(node string) {
	if n.hidden == nil {
		n.hidden = map[string]csi.ControllerClient{}
	}
	n.hidden[node] = n.clients[node]
	delete(n.clients, node)
}

func (n *nodes) unhide(node string) {
	n.clients[node] = n.hidden[node]
	delete(n.hidden, node)
}

func (n *nodes) Controller(_ context.Context, node string) (csi.ControllerClient, error) {
	c, ok := n.clients[node]
	if !ok {
		return nil, fmt.Errorf("node %s: no connection: %w", node, ErrUnreachable)
	}
	return c, nil
}

func (n *nodes) Names() []string {
	return append(slices.Collect(maps.Keys(n.clients)), n.listed...)
}

// locator is a fake Locator: handle -> nodes, or err for every lookup;
// names, when set, are the PVs' names by handle.
type locator struct {
	pvs   map[string][]string
	names map[string][]string
	err   error
}

func (l locator) NodesOf(handle string) ([]string, error) {
	if l.err != nil {
		return nil, l.err
	}
	return l.pvs[handle], nil
}

// PVsOf is names[handle], else a name for each node of handle
// ("pv-on-<node>").
func (l locator) PVsOf(handle string) ([]string, error) {
	if l.names != nil && l.err == nil {
		return l.names[handle], nil
	}
	nodes, err := l.NodesOf(handle)
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, "pv-on-"+n)
	}
	return names, err
}

// cluster starts the agents and returns their Nodes and the log of their
// calls.
func cluster(t *testing.T, agents ...*agent) (*nodes, *callLog) {
	t.Helper()
	log := &callLog{}
	ns := &nodes{clients: map[string]csi.ControllerClient{}}
	for _, a := range agents {
		a.log = log
		a.lis = &trackingListener{Listener: bufconn.Listen(1 << 20)}
		ns.clients[a.name] = serve(t, a, a.lis)
	}
	return ns, log
}

// serve serves srv on lis (an in-memory listener) until the test ends and
// returns its client.
func serve(t *testing.T, srv csi.ControllerServer, lis *trackingListener) csi.ControllerClient {
	t.Helper()
	g := grpc.NewServer()
	csi.RegisterControllerServer(g, srv)
	go func() { _ = g.Serve(lis) }() // ends with Stop
	t.Cleanup(g.Stop)
	dial := lis.Listener.(*bufconn.Listener).DialContext
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return csi.NewControllerClient(conn)
}

// vid is a carve volume ID of name.
func vid(name string) string { return volume.VolumeID("vg0", volume.LVNameFor(name)) }

// sid is a carve snapshot ID of name on node.
func sid(node, name string) string {
	return volume.SnapshotID(node, "vg0", volume.SnapshotLVNameFor(name))
}

// wantStatus checks err's code and that its message holds every part.
func wantStatus(t *testing.T, err error, code codes.Code, parts ...string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Errorf("code = %v (%v), want %v", st.Code(), err, code)
		return
	}
	for _, p := range parts {
		if !strings.Contains(st.Message(), p) {
			t.Errorf("message %q does not say %q", st.Message(), p)
		}
	}
}
