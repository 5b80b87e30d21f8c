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
	"strconv"
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
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/carve-csi/carve/pkg/nodeca"
	"github.com/carve-csi/carve/pkg/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The node channel of issue 21, beside the test bed's node-deployment
// layout: each simulated node's carve plugin also serves the node channel
// on its own loopback port, and TestNodeChannel runs a `carve controller
// --node-channel-service` that enrolls those agents with real TokenReviews,
// routes CSI Controller calls to them and writes CSIStorageCapacity
// objects in a namespace of its own (so the scheduler's view and the other
// scenarios' checks of the shipped layout's objects are not disturbed).
const (
	channelService  = "carve-node-channel-e2e"
	channelCA       = "carve-node-channel-e2e-ca"
	channelAudience = "carve-controller"
)

// channelDir holds each node's CA bundle and token files, as the kubelet
// would mount them: <dir>/<node>/ca.crt and <dir>/<node>/token.
var channelDir = filepath.Join(os.TempDir(), "carve-e2e-node-channel-"+strconv.Itoa(os.Getpid()))

// channelPorts are the nodes' node-channel ports, chosen before the test
// bed starts the plugins.
var channelPorts = map[string]int{}

// channelIP is the address the simulated nodes' agents listen on: an
// EndpointSlice may not hold a loopback address, so it is the host's own.
var channelIP = hostIP()

// hostIP is an IPv4 address of an interface of this host that is up and
// not loopback.
func hostIP() string {
	ifaces, err := net.Interfaces()
	if err != nil {
		panic(fmt.Sprintf("listing network interfaces: %v", err))
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String()
			}
		}
	}
	panic("the e2e tier needs an IPv4 address on a non-loopback interface: the node channel's EndpointSlices may not point at 127.0.0.1")
}

// channelAddr is node's node-channel address.
func channelAddr(node string) string {
	return net.JoinHostPort(channelIP, strconv.Itoa(channelPorts[node]))
}

// channelArgs are the node-channel flags of node's plugin.
func channelArgs(node string) []string {
	port, err := cluster.FreePort()
	if err != nil {
		panic(fmt.Sprintf("no free port for %s's node channel: %v", node, err))
	}
	channelPorts[node] = port
	dir := filepath.Join(channelDir, node)
	return []string{"--node-channel-address=" + net.JoinHostPort(channelIP, strconv.Itoa(port)),
		"--node-channel-ca-file=" + filepath.Join(dir, "ca.crt"),
		"--node-channel-token-file=" + filepath.Join(dir, "token")}
}

func TestNodeChannel(t *testing.T) {
	ctx := testCtx(t, 5*time.Minute)
	capNS := newNamespace(t, "capacity-channel")
	ds, _, err := bed.Manifests.NodeDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	sa := ds.Spec.Template.Spec.ServiceAccountName
	sock := filepath.Join(channelDir, "controller.sock")
	cc := &channelController{sa: sa, capNS: capNS, sock: sock}
	cc.start(t, ctx)
	t.Cleanup(cc.cleanup(t))
	caPEM := waitCABundle(t, ctx)
	for _, n := range bed.Nodes {
		giveAgentFiles(t, ctx, n, sa, caPEM)
		publishEndpoint(t, ctx, n)
	}

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctrl := csi.NewControllerClient(conn)

	t.Run("capacity objects follow each node", func(t *testing.T) { channelCapacity(t, capNS) })
	t.Run("CreateVolume reaches the selected node only", func(t *testing.T) { channelCreate(t, ctrl) })
	t.Run("an unreachable node is refused before anything is sent", func(t *testing.T) {
		ctx := testCtx(t, 30*time.Second)
		_, err := ctrl.CreateVolume(ctx, channelCreateRequest("channel-nowhere", "node-without-agent"))
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("CreateVolume on a node without an agent: %v, want ResourceExhausted (nothing sent, so csi-provisioner reschedules)", err)
		}
	})
	t.Run("the node port refuses callers without the controller's certificate", channelRefusals)
	t.Run("a node agent posing as another node is refused", func(t *testing.T) { channelImpostor(t, ctrl, cc) })
	t.Run("garbage on the node port harms nothing", func(t *testing.T) { channelGarbage(t, ctrl) })
	t.Run("a controller killed after the node made the volume converges on it", func(t *testing.T) {
		channelKilledController(t, ctx, cc)
	})
	t.Run("csi-sanity through the controller", func(t *testing.T) { channelSanity(t, sock) })
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

// channelController is the carve controller with the node channel on, run
// as the admin (its RBAC in deploy/ is the next step of issue 21).
type channelController struct {
	sa, capNS, sock string
	metricsURL      string
	proc            *cluster.Process
}

// start starts the controller and, the first time, the headless Service.
func (cc *channelController) start(t *testing.T, ctx context.Context) {
	if err := os.MkdirAll(channelDir, 0o755); err != nil {
		t.Fatal(err)
	}
	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cc.metricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	args := []string{"controller", "--endpoint=unix://" + cc.sock, "--kubeconfig=" + bed.Control.Kubeconfig,
		"--metrics-address=127.0.0.1:" + strconv.Itoa(port), "--leader-election=false", "--lost-nodes-interval=0",
		"--node-channel-service=" + channelService, "--node-channel-namespace=" + bed.Namespace,
		"--capacity-namespace=" + cc.capNS, "--node-service-account=" + cc.sa, "--node-channel-ca=" + channelCA,
		"--node-token-audience=" + channelAudience}
	if cc.proc, err = bed.StartProcess(ctx, "carve-controller-node-channel", bed.Config.CarveBin, args, nil); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: channelService, Namespace: bed.Namespace},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: "node-channel", Port: 9809}}}}
	if _, err := bed.Client.CoreV1().Services(bed.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p := cc.proc
	waitFor(t, 60*time.Second, "the controller's socket", func(ctx context.Context) (bool, string, error) {
		if ended, err := p.Exited(); ended {
			return false, "", fmt.Errorf("carve controller exited: %w\n%s", err, p.Tail(30))
		}
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", cc.sock)
		if err != nil {
			return askAgain(err)
		}
		return true, "", c.Close()
	})
}

// kill ends the controller as a crash would: SIGKILL, no grace.
func (cc *channelController) kill(t *testing.T) {
	if err := syscall.Kill(cc.proc.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	bed.StopProcess(cc.proc) // reaps it
	_ = os.Remove(cc.sock)
}

// cleanup stops the controller and removes what the test made.
func (cc *channelController) cleanup(t *testing.T) func() {
	return func() {
		if t.Failed() {
			t.Logf("carve controller (node channel) log:\n%s", cc.proc.Tail(60))
		}
		bed.StopProcess(cc.proc)
		cctx := context.Background()
		slices, err := bed.Client.DiscoveryV1().EndpointSlices(bed.Namespace).List(cctx,
			metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + channelService})
		if err == nil {
			for _, s := range slices.Items {
				_ = bed.Client.DiscoveryV1().EndpointSlices(bed.Namespace).Delete(cctx, s.Name, metav1.DeleteOptions{})
			}
		}
		_ = bed.Client.CoreV1().Services(bed.Namespace).Delete(cctx, channelService, metav1.DeleteOptions{})
		_ = bed.Client.CoreV1().ConfigMaps(bed.Namespace).Delete(cctx, channelCA, metav1.DeleteOptions{})
		_ = bed.Client.CoreV1().Secrets(bed.Namespace).Delete(cctx, channelCA, metav1.DeleteOptions{})
	}
}

// waitCABundle waits for the controller to publish its CA's certificate.
func waitCABundle(t *testing.T, ctx context.Context) []byte {
	var pem []byte
	waitFor(t, 60*time.Second, "ConfigMap "+channelCA, func(ctx context.Context) (bool, string, error) {
		cm, err := bed.Client.CoreV1().ConfigMaps(bed.Namespace).Get(ctx, channelCA, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "absent", nil
		}
		if err != nil {
			return false, "", err
		}
		pem = []byte(cm.Data["ca.crt"])
		return len(pem) > 0, "no ca.crt", nil
	})
	return pem
}

// giveAgentFiles does the kubelet's part for node n's agent: the CA bundle
// from the ConfigMap, and a token of the DaemonSet's service account bound
// to n's DaemonSet pod with the controller as audience.
func giveAgentFiles(t *testing.T, ctx context.Context, n *cluster.Node, sa string, caPEM []byte) {
	pod, err := bed.Client.CoreV1().Pods(bed.Namespace).Get(ctx, n.PodName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := bed.Client.CoreV1().ServiceAccounts(bed.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{channelAudience}, ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(channelDir, n.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
}

// publishEndpoint writes what the EndpointSlice controller would for n's
// agent pod once it is ready (simulated pods never run).
func publishEndpoint(t *testing.T, ctx context.Context, n *cluster.Node) {
	publishEndpointAs(t, ctx, n, n.Name)
}

// publishEndpointAs publishes n's agent as the endpoint of node, which an
// honest EndpointSlice never does for another node.
func publishEndpointAs(t *testing.T, ctx context.Context, n *cluster.Node, node string) {
	pod, err := bed.Client.CoreV1().Pods(bed.Namespace).Get(ctx, n.PodName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: channelService + "-" + node, Namespace: bed.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: channelService, discoveryv1.LabelManagedBy: "carve-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{channelIP}, NodeName: ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("node-channel"), Port: ptr.To(int32(channelPorts[n.Name]))}},
	}
	if _, err := bed.Client.DiscoveryV1().EndpointSlices(bed.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// channelCapacity: the controller's CSIStorageCapacity objects hold what
// each node's agent computes (VG free - spare), and an LV made outside
// carve on a node reaches them through the capacity stream.
func channelCapacity(t *testing.T, capNS string) {
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
				got, err := channelCapacityOf(ctx, capNS, n.Name, sc.Name)
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
		got, err := channelCapacityOf(ctx, capNS, n.Name, thickSC)
		return got == want, fmt.Sprintf("published %d, want %d", got, want), err
	})
	// A figure for the closing note, not a verdict: the bound is the
	// waitFor above.
	t.Logf("capacity freshness through the node channel: an outside lvcreate showed in CSIStorageCapacity after %s", time.Since(made).Round(time.Millisecond))
}

// channelCapacityOf is the capacity the controller published for node and
// StorageClass in ns; -1 when it wrote none.
func channelCapacityOf(ctx context.Context, ns, node, sc string) (int64, error) {
	list, err := bed.Client.StorageV1().CSIStorageCapacities(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return -1, err
	}
	found := int64(-1)
	for _, c := range list.Items {
		if c.StorageClassName != sc || c.NodeTopology == nil || c.NodeTopology.MatchLabels[cluster.TopologyKey] != node {
			continue
		}
		if found >= 0 {
			return -1, fmt.Errorf("two CSIStorageCapacity objects for %s and %s in %s", node, sc, ns)
		}
		found = 0
		if c.Capacity != nil {
			found = c.Capacity.Value()
		}
	}
	return found, nil
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
	addr := channelAddr("node-small")
	other, err := nodeca.NewCA(nodeca.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := nodeca.NewIssuer(other, nodeca.IssuerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := iss.IssueController()
	if err != nil {
		t.Fatal(err)
	}
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
func channelImpostor(t *testing.T, ctrl csi.ControllerClient, cc *channelController) {
	ctx := testCtx(t, time.Minute)
	small := bed.Node("node-small")
	before, err := scrape(ctx, cc.metricsURL, "carve_node_enrollments_total", `result="refused"`)
	if err != nil {
		before = 0 // no refusal counted yet: the series does not exist
	}
	publishEndpointAs(t, ctx, small, "node-impostor")
	defer func() {
		_ = bed.Client.DiscoveryV1().EndpointSlices(bed.Namespace).Delete(context.Background(), channelService+"-node-impostor", metav1.DeleteOptions{})
	}()
	waitFor(t, settle, "the controller to refuse the impostor's enrollment", func(ctx context.Context) (bool, string, error) {
		got, err := scrape(ctx, cc.metricsURL, "carve_node_enrollments_total", `result="refused"`)
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
	addr := channelAddr("node-small")
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

// channelKilledController: the node made the volume but the controller
// died before answering (here: the agent is asked directly, as the
// controller would have, then the controller is killed). The retry through
// a new controller process, which enrolls the nodes again with the CA in
// the Secret, answers that same volume; the node holds one LV.
func channelKilledController(t *testing.T, ctx context.Context, cc *channelController) {
	n := bed.Node("node-medium")
	conn, err := grpc.NewClient("unix://"+n.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	req := channelCreateRequest("channel-killed", n.Name)
	first, err := csi.NewControllerClient(conn).CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	cc.kill(t)
	cc.start(t, ctx)
	rconn, err := grpc.NewClient("unix://"+cc.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
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
	lvs, err := n.LVM.ListLVs(ctx, n.VG.Name)
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, lv := range lvs {
		if name, _, ok := volume.VolumeNameFromTags(lv.Tags); ok && name == "channel-killed" {
			count++
		}
	}
	if count != 1 {
		t.Errorf("node-medium holds %d LVs of channel-killed, want 1", count)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: first.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}
