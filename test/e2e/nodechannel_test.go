//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/nodeca/nodecatest"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The node channel of issue 21, the test bed's own layout: each simulated
// node's carve node serves the node channel on its own port of the
// host's address, and the controller Deployment's carve controller (run
// by the harness with its shipped flags and service account) enrolls
// those agents with real TokenReviews, routes the sidecars' CSI
// Controller calls to them and writes the CSIStorageCapacity objects the
// scheduler reads.
func TestNodeChannel(t *testing.T) {
	ctx := testCtx(t, 5*time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("carve controller log:\n%s", bed.Central.Controller().Tail(60))
		}
	})
	conn, err := grpc.NewClient("unix://"+bed.Central.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctrl := csi.NewControllerClient(conn)

	t.Run("capacity objects follow each node", channelCapacity)
	t.Run("CreateVolume reaches the selected node only", func(t *testing.T) { channelCreate(t, ctrl) })
	t.Run("an unreachable node is refused before anything is sent", func(t *testing.T) {
		ctx := testCtx(t, 30*time.Second)
		_, err := ctrl.CreateVolume(ctx, channelCreateRequest("channel-nowhere", "node-without-agent"))
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("CreateVolume on a node without an agent: %v, want ResourceExhausted (nothing sent, so csi-provisioner reschedules)", err)
		}
	})
	t.Run("the node port refuses callers without the controller's certificate", channelRefusals)
	t.Run("a node agent posing as another node is refused", func(t *testing.T) { channelImpostor(t, ctrl) })
	t.Run("garbage on the node port harms nothing", func(t *testing.T) { channelGarbage(t, ctrl) })
	t.Run("a controller killed after the node made the volume converges on it", func(t *testing.T) {
		channelKilledController(t, ctx)
	})
	t.Run("a node agent cut after a create was sent keeps the claim on its node", func(t *testing.T) {
		channelCutAfterSend(t, ctrl)
	})
	t.Run("csi-sanity through the controller", func(t *testing.T) { channelSanity(t, bed.Central.Socket) })
}

// askAgain tells waitFor to ask again, showing why not yet.
func askAgain(err error) (bool, string, error) { return false, err.Error(), nil }

// selectNode adds what csi-provisioner adds to a CreateVolume: the
// selected node as the requisite and preferred topology.
func selectNode(node string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*csi.CreateVolumeRequest); ok && r.GetAccessibilityRequirements() == nil {
			seg := &csi.Topology{Segments: map[string]string{cluster.TopologyKey: node}}
			r.AccessibilityRequirements = &csi.TopologyRequirement{Requisite: []*csi.Topology{seg}, Preferred: []*csi.Topology{seg}}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// channelSanity runs csi-sanity's Identity and Controller specs against
// the controller's socket, with node-small's plugin as the Node service
// (sanity asks it for the topology its volumes must have), so every
// Controller call is routed over the node channel to node-small's agent.
// As in the host tier, snapshots and copies need device-mapper, which the
// host's activation-off LVM lacks: the guest tier runs them against the
// plugin. Ginkgo allows one suite per process: this is the e2e tier's only
// one.
func channelSanity(t *testing.T, sock string) {
	n := bed.Node("node-small")
	dir := t.TempDir()
	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + n.Socket
	cfg.ControllerAddress = "unix://" + sock
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 64 << 20 // whole 4 MiB extents
	cfg.TestVolumeParameters = map[string]string{volume.ParamDeviceClass: thickClass}
	cfg.IdempotentCount = 2
	// csi-sanity sends CreateVolume without topology; csi-provisioner
	// (--strict-topology) always names the selected node, and the
	// controller refuses a create that names none.
	cfg.ControllerDialOptions = append(cfg.ControllerDialOptions, grpc.WithUnaryInterceptor(selectNode(n.Name)))
	sc := sanity.GinkgoTest(&cfg)
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.FocusStrings = []string{`\[Controller Server\]`, `Identity Service`}
	suite.SkipStrings = []string{`[Ss]napshot`, `from an existing source`}
	ginkgo.RunSpecs(t, "carve controller sanity through the node channel (e2e)", suite, reporter)
	sc.Finalize()
}

// channelCapacity: the controller's CSIStorageCapacity objects hold what
// each node's agent computes (VG free - spare), and an LV made outside
// carve on a node reaches them through the capacity stream.
func channelCapacity(t *testing.T) {
	scs, err := bed.StorageClasses()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range bed.Nodes {
		for _, sc := range scs {
			if c := shippedClass(sc.Parameters[volume.ParamDeviceClass]); c == nil || c.Thin() {
				continue
			}
			waitFor(t, settle, fmt.Sprintf("the controller's capacity of %s on %s", sc.Name, n.Name), func(ctx context.Context) (bool, string, error) {
				want, err := expectedThickCapacity(ctx, n)
				if err != nil {
					return false, "", err
				}
				got, err := capacityBytes(ctx, n.Name, sc.Name)
				return got == want, fmt.Sprintf("published %d, want %d", got, want), err
			})
		}
	}
	n := bed.Node("node-medium")
	ctx := testCtx(t, 2*time.Minute)
	if err := n.FillVG(ctx, "channel-outside", 128<<20); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := n.RemoveLV(context.Background(), "channel-outside"); err != nil {
			t.Errorf("removing the outside LV: %v", err)
		}
	}()
	made := time.Now()
	waitFor(t, settle, "the outside lvcreate to reach the controller's CSIStorageCapacity", func(ctx context.Context) (bool, string, error) {
		want, err := expectedThickCapacity(ctx, n)
		if err != nil {
			return false, "", err
		}
		got, err := capacityBytes(ctx, n.Name, thickSC)
		return got == want, fmt.Sprintf("published %d, want %d", got, want), err
	})
	// A figure for the closing note, not a verdict: the bound is the
	// waitFor above.
	t.Logf("capacity freshness through the node channel: an outside lvcreate showed in CSIStorageCapacity after %s", time.Since(made).Round(time.Millisecond))
}

func channelCreateRequest(name, node string) *csi.CreateVolumeRequest {
	seg := &csi.Topology{Segments: map[string]string{cluster.TopologyKey: node}}
	return &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities:        []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
		Parameters:                map[string]string{volume.ParamDeviceClass: thickClass},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{seg}, Preferred: []*csi.Topology{seg}}}
}

// channelCreate: a CreateVolume through the controller makes the LV on the
// node its topology names and on no other; DeleteVolume (no PV: the
// controller asks the nodes) removes it; both are idempotent.
func channelCreate(t *testing.T, ctrl csi.ControllerClient) {
	ctx := testCtx(t, time.Minute)
	target := bed.Node("node-small")
	var volID string
	waitFor(t, settle, "CreateVolume through the controller", func(ctx context.Context) (bool, string, error) {
		resp, err := ctrl.CreateVolume(ctx, channelCreateRequest("channel-e2e-1", target.Name))
		if err != nil {
			// The controller may not have enrolled the node yet.
			return askAgain(err)
		}
		volID = resp.GetVolume().GetVolumeId()
		return true, "", nil
	})
	again, err := ctrl.CreateVolume(ctx, channelCreateRequest("channel-e2e-1", target.Name))
	if err != nil || again.GetVolume().GetVolumeId() != volID {
		t.Fatalf("CreateVolume again: %v, %v; want the same volume %s", again, err, volID)
	}
	id, err := volume.ParseID(volID)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range bed.Nodes {
		_, err := n.LVM.GetLV(ctx, n.VG.Name, id.LV)
		switch has := err == nil; {
		case n == target && !has:
			t.Errorf("node %s lacks the LV %s: %v", n.Name, id.LV, err)
		case n != target && has:
			t.Errorf("node %s has the LV %s, made for %s", n.Name, id.LV, target.Name)
		}
	}
	for range 2 {
		if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: volID}); err != nil {
			t.Fatalf("DeleteVolume through the controller: %v", err)
		}
	}
	if _, err := target.LVM.GetLV(ctx, target.VG.Name, id.LV); err == nil {
		t.Errorf("the LV %s is still on %s after DeleteVolume", id.LV, target.Name)
	}
}

// channelRefusals: the node port completes no call for a caller without a
// client certificate, with one from another CA, or without TLS.
func channelRefusals(t *testing.T) {
	addr := bed.Node("node-small").ChannelAddr
	_, _, foreign := nodecatest.NewControllerIssuer(t)
	tlsNoVerify := func(certs ...tls.Certificate) credentials.TransportCredentials {
		// The server is not checked here: what is tested is whether it
		// serves this client.
		return credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: certs})
	}
	for _, c := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"plain gRPC, no TLS", insecure.NewCredentials()},
		{"TLS without a client certificate", tlsNoVerify()},
		{"a controller certificate from another CA", tlsNoVerify(*foreign)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			_, err = csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
			if err == nil {
				t.Fatal("the node port answered Probe")
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatalf("the call hung until the deadline instead of being refused: %v", err)
			}
		})
	}
}

// channelImpostor: node-small's agent published as the endpoint of a node
// named node-impostor proves, with its pod-bound token, that it runs on
// node-small: the controller refuses to enroll it as node-impostor, so a
// volume for node-impostor is never made on node-small.
func channelImpostor(t *testing.T, ctrl csi.ControllerClient) {
	ctx := testCtx(t, time.Minute)
	small := bed.Node("node-small")
	metrics := bed.Central.MetricsURL
	before, err := scrape(ctx, metrics, "carve_node_enrollments_total", `result="refused"`)
	if err != nil {
		before = 0 // no refusal counted yet: the series does not exist
	}
	nc := bed.NodeChannel
	if err := nc.PublishEndpoint(ctx, bed.Client, small, "node-impostor"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = bed.Client.DiscoveryV1().EndpointSlices(nc.Namespace).Delete(context.Background(), nc.EndpointSliceName("node-impostor"), metav1.DeleteOptions{})
	}()
	waitFor(t, settle, "the controller to refuse the impostor's enrollment", func(ctx context.Context) (bool, string, error) {
		got, err := scrape(ctx, metrics, "carve_node_enrollments_total", `result="refused"`)
		if err != nil {
			return askAgain(err)
		}
		return got > before, fmt.Sprintf("refused enrollments %v, before %v", got, before), nil
	})
	_, err = ctrl.CreateVolume(ctx, channelCreateRequest("channel-impostor", "node-impostor"))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateVolume for node-impostor: %v, want ResourceExhausted (its agent is not enrolled)", err)
	}
	lvs, err := small.LVM.ListLVs(ctx, small.VG.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, lv := range lvs {
		if lv.Name == volume.LVNameFor("channel-impostor") {
			t.Errorf("node-small made %s for node-impostor", lv.Name)
		}
	}
}

// channelGarbage: bytes that are not TLS on the node port neither stop the
// agent nor the controller's connection to it.
func channelGarbage(t *testing.T, ctrl csi.ControllerClient) {
	ctx := testCtx(t, time.Minute)
	addr := bed.Node("node-small").ChannelAddr
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), {0x16, 0x03, 0x01, 0xff, 0xff, 0, 0, 0}, make([]byte, 64<<10)} {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write(junk)
		_ = c.Close()
	}
	resp, err := ctrl.CreateVolume(ctx, channelCreateRequest("channel-after-garbage", "node-small"))
	if err != nil {
		t.Fatalf("CreateVolume on node-small after garbage on its port: %v", err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if ended, err := bed.Node("node-small").Plugin().Exited(); ended {
		t.Fatalf("node-small's agent exited: %v", err)
	}
}

// channelKilledController: the node made the volume and the controller
// died before the caller heard of it (here: a create through the
// controller, then the test bed's carve controller is killed with SIGKILL
// and started again, its sidecars with it). The retry through
// the new controller process, which enrolls the nodes again with the CA in
// the Secret, answers that same volume; the node holds one LV.
func channelKilledController(t *testing.T, ctx context.Context) {
	n := bed.Node("node-medium")
	conn, err := grpc.NewClient("unix://"+bed.Central.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	req := channelCreateRequest("channel-killed", n.Name)
	first, err := csi.NewControllerClient(conn).CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := bed.Central.RestartController(ctx); err != nil {
		t.Fatal(err)
	}
	rconn, err := grpc.NewClient("unix://"+bed.Central.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rconn.Close() }()
	ctrl := csi.NewControllerClient(rconn)
	var again *csi.CreateVolumeResponse
	waitFor(t, settle, "the retried CreateVolume through the new controller", func(ctx context.Context) (bool, string, error) {
		again, err = ctrl.CreateVolume(ctx, req)
		if err != nil {
			return askAgain(err) // not enrolled again yet
		}
		return true, "", nil
	})
	if again.GetVolume().GetVolumeId() != first.GetVolume().GetVolumeId() {
		t.Errorf("the retry answered %s, the node made %s", again.GetVolume().GetVolumeId(), first.GetVolume().GetVolumeId())
	}
	if count := lvsNamed(t, ctx, n, "channel-killed"); count != 1 {
		t.Errorf("node-medium holds %d LVs of channel-killed, want 1", count)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: first.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}

// channelCutAfterSend is failure 2 of issue 21 after the send: the node's
// lvcreate has started (it waits on the volume group's LVM lock, which
// the test holds) when the node agent is killed. From then on the node is
// unreachable, and the controller must answer UNAVAILABLE, never
// RESOURCE_EXHAUSTED (which would let csi-provisioner move the claim and
// leave the LV behind). Once the lock is let go the lvcreate finishes on
// its own; the restarted agent's answer to the retry is that LV, the only
// one of the name.
func channelCutAfterSend(t *testing.T, ctrl csi.ControllerClient) {
	ctx := testCtx(t, 4*time.Minute)
	n := bed.Node("node-small")
	req := channelCreateRequest("channel-cut", n.Name)
	unlock := holdVGLock(t, n.VG.Name)
	defer unlock()

	answer := make(chan error, 1)
	go func() {
		_, err := ctrl.CreateVolume(ctx, req)
		answer <- err
	}()
	waitFor(t, settle, "the node's lvcreate in "+n.VG.Name+" to wait on the lock", func(context.Context) (bool, string, error) {
		pids, err := lvmCommands("lvcreate", n.VG.Name)
		return len(pids) > 0, "no lvcreate yet", err
	})
	if err := n.KillPlugin(); err != nil {
		t.Fatal(err)
	}
	if err := <-answer; status.Code(err) == codes.OK || status.Code(err) == codes.ResourceExhausted {
		t.Fatalf("CreateVolume whose node agent died during lvcreate: %v, want an answer that keeps the claim on %s (not OK, not ResourceExhausted)", err, n.Name)
	}
	retry, cancel := context.WithTimeout(ctx, 20*time.Second)
	_, err := ctrl.CreateVolume(retry, req)
	cancel()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("retried CreateVolume while %s's agent is down after a create was sent: %v, want Unavailable (the claim must not move)", n.Name, err)
	}

	unlock()
	waitFor(t, settle, "the orphaned lvcreate to finish", func(context.Context) (bool, string, error) {
		pids, err := lvmCommands("lvcreate", n.VG.Name)
		return len(pids) == 0, fmt.Sprintf("lvcreate %v still running", pids), err
	})
	if err := n.StartPlugin(ctx); err != nil {
		t.Fatal(err)
	}
	var volID string
	waitFor(t, settle, "the retried CreateVolume once the agent is back", func(ctx context.Context) (bool, string, error) {
		resp, err := ctrl.CreateVolume(ctx, req)
		switch status.Code(err) {
		case codes.OK:
			volID = resp.GetVolume().GetVolumeId()
			return true, "", nil
		case codes.ResourceExhausted:
			return false, "", fmt.Errorf("a create was sent to %s, yet the retry was told to move: %w", n.Name, err)
		}
		return askAgain(err) // not enrolled again yet
	})
	if got := lvsNamed(t, ctx, n, "channel-cut"); got != 1 {
		t.Errorf("%s holds %d LVs of channel-cut, want 1", n.Name, got)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: volID}); err != nil {
		t.Fatal(err)
	}
}

// holdVGLock takes LVM's own lock of the volume group (flock on
// /run/lock/lvm/V_<vg>, as lvm2's file locking does), so that LVM
// commands on it wait. The returned function lets go; calling it again
// does nothing.
func holdVGLock(t *testing.T, vg string) func() {
	t.Helper()
	f, err := os.OpenFile(filepath.Join("/run/lock/lvm", "V_"+vg), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(errors.Join(err, f.Close()))
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if err := errors.Join(syscall.Flock(int(f.Fd()), syscall.LOCK_UN), f.Close()); err != nil {
				t.Errorf("letting go of the LVM lock of %s: %v", vg, err)
			}
		})
	}
}

// lvmCommands returns the pids of running LVM commands named command
// (lvm's subcommand or its symlink) whose arguments mention vg.
func lvmCommands(command, vg string) ([]int, error) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		// carve runs "lvm <command> ..."; a person may run "<command> ...".
		if len(args) > 1 && filepath.Base(args[0]) == "lvm" {
			args = args[1:]
		}
		if len(args) > 0 && filepath.Base(args[0]) == command && slices.ContainsFunc(args[1:], func(a string) bool { return strings.Contains(a, vg) }) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// lvsNamed counts the LVs on n whose tags name the CSI volume name.
func lvsNamed(t *testing.T, ctx context.Context, n *cluster.Node, name string) int {
	t.Helper()
	lvs, err := n.LVM.ListLVs(ctx, n.VG.Name)
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, lv := range lvs {
		if got, _, ok := volume.VolumeNameFromTags(lv.Tags); ok && got == name {
			count++
		}
	}
	return count
}
