//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/channel"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/nodeca"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
)

// liarNode is the node the lying agent serves.
const liarNode = "node-liar"

// liar is a node agent the test drives: it enrolls as node-liar with a
// genuine token of that node's DaemonSet pod, so carve controller signs
// it a genuine node certificate, and then answers the controller's CSI
// calls with whatever the test sets: root on a node can make its agent say
// anything.
type liar struct {
	csi.UnimplementedControllerServer
	csi.UnimplementedIdentityServer

	mu       sync.Mutex
	create   func(context.Context, *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error)
	snapshot func(*csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error)
	list     func(*csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error)
	// calls counts the CSI Controller calls it got, by method.
	calls sync.Map // string -> *atomic.Int64
}

func (l *liar) count(method string) {
	c, _ := l.calls.LoadOrStore(method, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
}

func (l *liar) calledTimes(method string) int64 {
	if c, ok := l.calls.Load(method); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

func (l *liar) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "lvm.carve.dev", VendorVersion: "liar"}, nil
}

func (l *liar) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (l *liar) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	l.count("CreateVolume")
	l.mu.Lock()
	fn := l.create
	l.mu.Unlock()
	if fn == nil {
		return nil, status.Error(codes.ResourceExhausted, "the liar makes nothing")
	}
	return fn(ctx, req)
}

func (l *liar) CreateSnapshot(_ context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	l.count("CreateSnapshot")
	l.mu.Lock()
	fn := l.snapshot
	l.mu.Unlock()
	if fn == nil {
		return nil, status.Error(codes.NotFound, "the liar has no volume")
	}
	return fn(req)
}

func (l *liar) ListSnapshots(_ context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	l.count("ListSnapshots")
	l.mu.Lock()
	fn := l.list
	l.mu.Unlock()
	if fn == nil {
		return &csi.ListSnapshotsResponse{}, nil
	}
	return fn(req)
}

// ValidateVolumeCapabilities claims every volume it is asked about.
func (l *liar) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	l.count("ValidateVolumeCapabilities")
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeCapabilities: req.GetVolumeCapabilities()}}, nil
}

func (l *liar) DeleteVolume(context.Context, *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	l.count("DeleteVolume")
	return &csi.DeleteVolumeResponse{}, nil
}

// noRoom is a node without device classes: it reports no capacity, so
// the scheduler never picks the liar's node for other tests' claims.
type noRoom struct{}

func (noRoom) Capacity(*deviceclass.DeviceClass) (vgview.Capacity, error) {
	return vgview.Capacity{}, nil
}
func (noRoom) Changes() <-chan struct{}     { return nil }
func (noRoom) Volumes() []lvm.LogicalVolume { return nil }
func (noRoom) Readable(string) bool         { return true }

// startLiar seats node-liar, serves its agent and waits until carve
// controller has enrolled it.
func startLiar(t *testing.T, ctx context.Context) *liar {
	t.Helper()
	seat, err := bed.SeatAgent(ctx, liarNode, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Unseat(context.Background(), seat); err != nil {
			t.Error(err)
		}
	})
	bundle := nodeca.NewBundleFile(seat.CAFile)
	if err := bundle.Load(); err != nil {
		t.Fatal(err)
	}
	agent, err := channel.New(channel.Config{NodeName: liarNode, TokenFile: seat.TokenFile, Trust: bundle.Pool(),
		Classes: &deviceclass.Config{}, Capacity: noRoom{}, Inventory: noRoom{}})
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := agent.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	l := &liar{}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}))
	nodeagentv1.RegisterNodeAgentServer(srv, agent)
	csi.RegisterControllerServer(srv, l)
	csi.RegisterIdentityServer(srv, l)
	lis, err := net.Listen("tcp", net.JoinHostPort(bed.NodeChannel.IP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		agent.Shutdown()
		srv.Stop()
	})
	if err := bed.PublishSeat(ctx, seat, lis.Addr().(*net.TCPAddr).Port); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "carve controller to enroll "+liarNode, func(ctx context.Context) (bool, string, error) {
		n, err := scrape(ctx, bed.Central.MetricsURL, "carve_node_channel_certificate_expiry_timestamp_seconds", `node="`+liarNode+`"`)
		if err != nil {
			return askAgain(err)
		}
		return n > 0, "no certificate of " + liarNode + " yet", nil
	})
	return l
}

// refusals is carve controller's count of refused answers of node-liar
// for reason.
func refusals(ctx context.Context, reason string) float64 {
	n, err := scrape(ctx, bed.Central.MetricsURL, "carve_node_answers_refused_total", `node="`+liarNode+`"`, `reason="`+reason+`"`)
	if err != nil {
		return 0 // no series yet
	}
	return n
}

// TestLyingNode: a node agent with a genuine node certificate that
// answers about other nodes' volumes and snapshots, claims every volume,
// pages without end and stalls gets none of its lies written: no
// PersistentVolume is bound from its answer, no other node's volume is
// snapshotted or deleted through it, and the other nodes' calls go on.
func TestLyingNode(t *testing.T) {
	ctx := testCtx(t, 8*time.Minute)
	// Once the liar is gone, the tests that follow see a controller no
	// node lied to (TestPrometheus holds the refusal counter to have no
	// series on the bed).
	t.Cleanup(func() {
		if err := bed.Central.RestartController(context.Background()); err != nil {
			t.Errorf("restarting carve controller after the liar: %v", err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("carve controller log:\n%s", bed.Central.Controller().Tail(60))
		}
	})
	l := startLiar(t, ctx)
	conn, err := grpc.NewClient("unix://"+bed.Central.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctrl := csi.NewControllerClient(conn)
	small := bed.Node("node-small")

	t.Run("a volume it places on another node is never bound", func(t *testing.T) {
		ns := newNamespace(t, "liar")
		for _, lie := range []struct {
			reason string
			answer func(req *csi.CreateVolumeRequest) *csi.Volume
		}{
			{"topology", func(req *csi.CreateVolumeRequest) *csi.Volume {
				return &csi.Volume{VolumeId: volume.VolumeID(small.VG.Name, volume.LVNameFor(req.GetName())), CapacityBytes: req.GetCapacityRange().GetRequiredBytes(),
					AccessibleTopology: []*csi.Topology{{Segments: map[string]string{cluster.TopologyKey: small.Name}}},
					VolumeContext:      map[string]string{volume.ContextVolumeName: req.GetName()}}
			}},
			{"volume_id", func(req *csi.CreateVolumeRequest) *csi.Volume {
				return &csi.Volume{VolumeId: volume.VolumeID(small.VG.Name, volume.LVNameFor("someone-else")), CapacityBytes: req.GetCapacityRange().GetRequiredBytes(),
					AccessibleTopology: []*csi.Topology{{Segments: map[string]string{cluster.TopologyKey: liarNode}}},
					VolumeContext:      map[string]string{volume.ContextVolumeName: req.GetName()}}
			}},
		} {
			before := refusals(ctx, lie.reason)
			l.mu.Lock()
			l.create = func(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
				return &csi.CreateVolumeResponse{Volume: lie.answer(req)}, nil
			}
			l.mu.Unlock()
			claim := "lie-" + lie.reason[:5]
			pvc := newPVC(ns, claim, thickSC, "64Mi")
			pvc.Annotations = map[string]string{annSelected: liarNode}
			if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Minute, "carve controller to refuse the liar's "+lie.reason, func(ctx context.Context) (bool, string, error) {
				n := refusals(ctx, lie.reason)
				return n > before, fmt.Sprintf("refusals %v, before %v", n, before), nil
			})
			got, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Spec.VolumeName != "" || got.Status.Phase == "Bound" {
				t.Errorf("claim %s bound to %q from the liar's answer", claim, got.Spec.VolumeName)
			}
			if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		pvs, err := bed.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, pv := range pvs.Items {
			if ref := pv.Spec.ClaimRef; ref != nil && ref.Namespace == ns {
				t.Errorf("PV %s exists for claim %s/%s from the liar's answer", pv.Name, ref.Namespace, ref.Name)
			}
		}
	})

	t.Run("a snapshot it names on another node is refused", func(t *testing.T) {
		before := refusals(ctx, "snapshot_id")
		l.mu.Lock()
		l.snapshot = func(req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
			return &csi.CreateSnapshotResponse{Snapshot: &csi.Snapshot{
				SnapshotId:     volume.SnapshotID(small.Name, small.VG.Name, volume.SnapshotLVNameFor(req.GetName())),
				SourceVolumeId: req.GetSourceVolumeId(), ReadyToUse: true}}, nil
		}
		l.mu.Unlock()
		// A volume no PV holds and only the liar claims: the controller
		// asks every node, and routes the snapshot to the liar.
		_, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "liar-snap",
			SourceVolumeId: volume.VolumeID("vg-liar", volume.LVNameFor("liar-own"))})
		if status.Code(err) != codes.Internal {
			t.Fatalf("CreateSnapshot answered with node-small's snapshot ID: %v, want Internal (refused)", err)
		}
		if n := refusals(ctx, "snapshot_id"); n <= before {
			t.Errorf("snapshot_id refusals %v, before %v", n, before)
		}
	})

	t.Run("claiming every volume reaches no other node's", func(t *testing.T) {
		// node-small makes a volume no PV holds; both nodes then claim it.
		resp, err := ctrl.CreateVolume(ctx, channelCreateRequest("liar-victim", small.Name))
		if err != nil {
			t.Fatal(err)
		}
		id := resp.GetVolume().GetVolumeId()
		snapsBefore := l.calledTimes("CreateSnapshot")
		_, err = ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
		if status.Code(err) != codes.Internal {
			t.Errorf("DeleteVolume of a volume two nodes claim: %v, want Internal (neither is trusted)", err)
		}
		_, err = ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "liar-victim-snap", SourceVolumeId: id})
		if status.Code(err) != codes.Internal {
			t.Errorf("CreateSnapshot of a volume two nodes claim: %v, want Internal", err)
		}
		if n := l.calledTimes("CreateSnapshot"); n != snapsBefore {
			t.Errorf("the liar got %d CreateSnapshot calls for node-small's volume", n-snapsBefore)
		}
		if n := l.calledTimes("DeleteVolume"); n != 0 {
			t.Errorf("the liar got %d DeleteVolume calls", n)
		}
		if lvsNamed(t, ctx, small, "liar-victim") != 1 {
			t.Error("node-small's volume is gone")
		}
		// The controller cannot delete it while the liar claims it too.
		if err := small.LVM.RemoveLV(ctx, small.VG.Name, volume.LVNameFor("liar-victim")); err != nil {
			t.Error(err)
		}
	})

	t.Run("endless pages fail its own list, bounded", func(t *testing.T) {
		before := refusals(ctx, "paging")
		l.mu.Lock()
		l.list = func(req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
			n, _ := strconv.Atoi(req.GetStartingToken())
			entries := make([]*csi.ListSnapshotsResponse_Entry, 100)
			for i := range entries {
				entries[i] = &csi.ListSnapshotsResponse_Entry{Snapshot: &csi.Snapshot{
					SnapshotId:     volume.SnapshotID(liarNode, "vg-liar", volume.SnapshotLVNameFor(fmt.Sprintf("s-%d-%d", n, i))),
					SourceVolumeId: volume.VolumeID("vg-liar", volume.LVNameFor("liar-own")), ReadyToUse: true}}
			}
			return &csi.ListSnapshotsResponse{Entries: entries, NextToken: strconv.Itoa(n + 1)}, nil
		}
		l.mu.Unlock()
		_, err := ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
		if status.Code(err) != codes.Internal {
			t.Errorf("ListSnapshots with a node paging without end: %v, want Internal (refused)", err)
		}
		if n := refusals(ctx, "paging"); n <= before {
			t.Errorf("paging refusals %v, before %v", n, before)
		}
		// Asked for node-small's page alone, the list works.
		if _, err := ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: small.Name + "/", MaxEntries: 1}); err != nil {
			t.Errorf("ListSnapshots from node-small: %v", err)
		}
	})

	t.Run("a stalled answer holds no other node's call", func(t *testing.T) {
		stalled := make(chan struct{})
		released := make(chan struct{})
		l.mu.Lock()
		l.create = func(ctx context.Context, _ *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
			close(stalled)
			select {
			case <-released:
			case <-ctx.Done():
			}
			return nil, status.Error(codes.ResourceExhausted, "stalled")
		}
		l.mu.Unlock()
		var liarDone atomic.Bool
		go func() {
			_, _ = ctrl.CreateVolume(ctx, channelCreateRequest("liar-stall", liarNode))
			liarDone.Store(true)
		}()
		<-stalled
		resp, err := ctrl.CreateVolume(ctx, channelCreateRequest("liar-beside-stall", small.Name))
		if err != nil {
			t.Fatalf("CreateVolume on node-small while the liar stalls: %v", err)
		}
		if liarDone.Load() {
			t.Error("the liar's call ended before node-small's: the stall was not under way")
		}
		close(released)
		if vg, lv, err := volume.ParseVolumeID(resp.GetVolume().GetVolumeId()); err != nil {
			t.Error(err)
		} else if err := small.LVM.RemoveLV(ctx, vg, lv); err != nil {
			t.Error(err)
		}
	})
}
