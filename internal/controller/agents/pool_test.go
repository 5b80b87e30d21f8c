package agents

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/nodeca"
)

const (
	testNS       = "carve"
	testService  = "carve-node"
	testPort     = "node-channel"
	testSA       = "carve-node"
	testAudience = "carve-controller"
)

// fakeAgent is a minimal node agent: a key in memory, a self-signed
// certificate until one is installed, NodeAgent and a CSI Controller that
// answers ControllerGetCapabilities. It is not internal/node/channel: the pool is
// tested against the protocol, not against that implementation.
type fakeAgent struct {
	nodeagentv1.UnimplementedNodeAgentServer
	csi.UnimplementedControllerServer
	csi.UnimplementedIdentityServer

	claims string // the node it names in Enroll
	token  string
	key    *ecdsa.PrivateKey
	cert   *nodeca.Keypair
	// present, when set, is presented instead of any installed certificate.
	present  *tls.Certificate
	enrolls  atomic.Int32
	installs atomic.Int32
	infos    atomic.Int32 // GetPluginInfo calls
	reports  chan *nodeagentv1.CapacityReport
	// keyAnswers gets the answers to VolumeKeys' requests.
	keyAnswers chan *nodeagentv1.VolumeKeyAnswer
	end        chan struct{} // a send ends the current capacity stream
	addr       string
	srv        *grpc.Server
}

func (f *fakeAgent) Enroll(context.Context, *nodeagentv1.EnrollRequest) (*nodeagentv1.EnrollResponse, error) {
	f.enrolls.Add(1)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: f.claims}}, f.key)
	if err != nil {
		return nil, err
	}
	return &nodeagentv1.EnrollResponse{NodeName: f.claims, Token: f.token, CsrDer: csr}, nil
}

func (f *fakeAgent) InstallCertificate(_ context.Context, r *nodeagentv1.InstallCertificateRequest) (*nodeagentv1.InstallCertificateResponse, error) {
	f.installs.Add(1)
	if f.present != nil {
		f.cert.Set(f.present)
	} else {
		f.cert.Set(&tls.Certificate{Certificate: [][]byte{r.GetCertificateDer()}, PrivateKey: f.key})
	}
	return &nodeagentv1.InstallCertificateResponse{}, nil
}

func (f *fakeAgent) WatchCapacity(_ *nodeagentv1.WatchCapacityRequest, s grpc.ServerStreamingServer[nodeagentv1.CapacityReport]) error {
	first := &nodeagentv1.CapacityReport{NodeName: f.claims, Classes: []*nodeagentv1.ClassCapacity{{DeviceClass: "thin", AvailableBytes: 1 << 30}}}
	if err := s.Send(first); err != nil {
		return err
	}
	for {
		select {
		case <-s.Context().Done():
			return nil
		case <-f.end:
			return nil
		case r := <-f.reports:
			if err := s.Send(r); err != nil {
				return err
			}
		}
	}
}

// VolumeKeys asks for one key on each stream the pool opens and hands the
// answer to keyAnswers.
func (f *fakeAgent) VolumeKeys(s grpc.BidiStreamingServer[nodeagentv1.VolumeKeyAnswer, nodeagentv1.VolumeKeyRequest]) error {
	if err := s.Send(&nodeagentv1.VolumeKeyRequest{RequestId: 3, VolumeId: "vg/carve-aa", KeyId: "k", WrappedKey: "w"}); err != nil {
		return err
	}
	a, err := s.Recv()
	if err != nil {
		return err
	}
	f.keyAnswers <- a
	<-s.Context().Done()
	return nil
}

func (f *fakeAgent) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
	}}}, nil
}

func (f *fakeAgent) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	f.infos.Add(1)
	return &csi.GetPluginInfoResponse{Name: "lvm.carve.dev", VendorVersion: "fake"}, nil
}

// selfSigned is the agent's bootstrap certificate.
func selfSigned(t *testing.T, key *ecdsa.PrivateKey) *tls.Certificate {
	t.Helper()
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bootstrap"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

type capEvent struct {
	node string
	r    *nodeagentv1.CapacityReport
}

// env is a fake API server, carve's CA and the pool under test.
type env struct {
	t      *testing.T
	client *fake.Clientset
	ca     *nodeca.CA
	iss    *nodeca.Issuer
	trust  *nodeca.Pool
	ctrl   *nodeca.Keypair
	reg    *prometheus.Registry
	caps   chan capEvent
	pool   *Pool

	mu      sync.Mutex
	reviews map[string]authv1.TokenReviewStatus // by token
}

func newEnv(t *testing.T, nodeValidity time.Duration) *env {
	t.Helper()
	ca, err := nodeca.NewCA(nodeca.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := nodeca.NewIssuer(ca, nodeca.IssuerOptions{NodeValidity: nodeValidity})
	if err != nil {
		t.Fatal(err)
	}
	ctrlCert, err := iss.IssueController()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, client: fake.NewClientset(), ca: ca, iss: iss, trust: nodeca.NewPool(ca.Cert),
		ctrl: nodeca.NewKeypair(ctrlCert), reg: prometheus.NewRegistry(),
		caps: make(chan capEvent, 100), reviews: map[string]authv1.TokenReviewStatus{}}
	e.client.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		tr := action.(k8stesting.CreateAction).GetObject().(*authv1.TokenReview).DeepCopy()
		e.mu.Lock()
		st, ok := e.reviews[tr.Spec.Token]
		e.mu.Unlock()
		if !ok {
			st = authv1.TokenReviewStatus{Error: "unknown token"}
		}
		tr.Status = st
		return true, tr, nil
	})
	e.pool, err = New(Config{Client: e.client, Namespace: testNS, Service: testService, PortName: testPort,
		ServiceAccount: testSA, Audience: testAudience, Issuer: iss, Identity: e.ctrl, Trust: e.trust,
		OnCapacity: func(node string, r *nodeagentv1.CapacityReport) { e.caps <- capEvent{node, r} },
		OnKeyRequest: func(_ context.Context, node string, r *nodeagentv1.VolumeKeyRequest) *nodeagentv1.VolumeKeyAnswer {
			// The answer names the node the request came from, as the
			// pool saw it.
			return &nodeagentv1.VolumeKeyAnswer{RequestId: r.GetRequestId(), Refused: "asked by " + node + " for " + r.GetVolumeId()}
		},
		Registerer: e.reg})
	if err != nil {
		t.Fatal(err)
	}
	e.pool.t = timing{minBackoff: 20 * time.Millisecond, maxBackoff: 200 * time.Millisecond,
		callTimeout: 5 * time.Second, drainGrace: 100 * time.Millisecond}
	return e
}

// run starts the pool and stops it at the end of the test.
func (e *env) run() {
	_, ctx := ktesting.NewTestContext(e.t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- e.pool.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
	if !e.pool.WaitForSync(ctx) {
		e.t.Fatal("pool never synced")
	}
}

// agent starts a fake agent for node whose token the API server reviews
// as st (a good review unless edit changes it).
// runOneAgent is an env running with one agent, node's pod
// carve-node-abcde, published.
func runOneAgent(t *testing.T, node string) (*env, *fakeAgent) {
	t.Helper()
	e := newEnv(t, 0)
	const pod, uid = "carve-node-abcde", types.UID("uid-a")
	f := e.agent(node, pod, uid, nil)
	e.publish("s1", node, pod, uid, f)
	e.run()
	return e, f
}

// twoPods are agents of pod-1 and pod-2, both claiming node.
func (e *env) twoPods(node string) (*fakeAgent, *fakeAgent) {
	return e.agent(node, "pod-1", "uid-1", nil), e.agent(node, "pod-2", "uid-2", nil)
}

func (e *env) agent(node, pod string, uid types.UID, edit func(*authv1.TokenReviewStatus)) *fakeAgent {
	e.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		e.t.Fatal(err)
	}
	f := &fakeAgent{claims: node, token: "token-of-" + pod, key: key, cert: nodeca.NewKeypair(selfSigned(e.t, key)),
		reports: make(chan *nodeagentv1.CapacityReport, 10), end: make(chan struct{}), keyAnswers: make(chan *nodeagentv1.VolumeKeyAnswer, 10)}
	st := goodReview(node, pod, string(uid))
	if edit != nil {
		edit(&st)
	}
	e.mu.Lock()
	e.reviews[f.token] = st
	e.mu.Unlock()

	e.serve(f, "127.0.0.1:0")
	return f
}

// serve starts f's server on addr; the test's end stops it.
func (e *env) serve(f *fakeAgent, addr string) {
	e.t.Helper()
	cfg, err := nodeca.ServerConfig(nodeca.Peer{Cert: f.cert, CAs: e.trust})
	if err != nil {
		e.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		e.t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}))
	nodeagentv1.RegisterNodeAgentServer(srv, f)
	csi.RegisterControllerServer(srv, f)
	csi.RegisterIdentityServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	e.t.Cleanup(srv.Stop)
	f.addr, f.srv = ln.Addr().String(), srv
}

// restart is the agent's process restarting in its pod: the same address,
// a new key, the bootstrap certificate again.
func (e *env) restart(f *fakeAgent) {
	e.t.Helper()
	f.srv.Stop()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		e.t.Fatal(err)
	}
	f.key = key
	f.cert.Set(selfSigned(e.t, key))
	e.serve(f, f.addr)
}

func goodReview(node, pod, uid string) authv1.TokenReviewStatus {
	return authv1.TokenReviewStatus{Authenticated: true, Audiences: []string{testAudience},
		User: authv1.UserInfo{Username: "system:serviceaccount:" + testNS + ":" + testSA,
			Extra: map[string]authv1.ExtraValue{extraPodName: {pod}, extraPodUID: {uid}, extraNodeName: {node}}}}
}

// publish creates (or replaces) the EndpointSlice named name with one
// endpoint for the agent.
func (e *env) publish(name, node, pod string, uid types.UID, f *fakeAgent) {
	e.t.Helper()
	host, port, err := net.SplitHostPort(f.addr)
	if err != nil {
		e.t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		e.t.Fatal(err)
	}
	s := endpointSlice(name, int32(p), ep(node, pod, uid, host, true))
	slices := e.client.DiscoveryV1().EndpointSlices(testNS)
	if _, err := slices.Create(e.t.Context(), s, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = slices.Update(e.t.Context(), s, metav1.UpdateOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
	} else if err != nil {
		e.t.Fatal(err)
	}
}

func endpointSlice(name string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	portName := testPort
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: testNS, Labels: map[string]string{discoveryv1.LabelServiceName: testService}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		Endpoints:   eps,
	}
}

func ep(node, pod string, uid types.UID, addr string, ready bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: &node,
		Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: testNS, Name: pod, UID: uid}}
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lastErr is why the pool has no verified connection to node (nil when it
// has one).
func (e *env) lastErr(node string) error {
	e.pool.mu.Lock()
	a := e.pool.agents[node]
	e.pool.mu.Unlock()
	if a == nil {
		return errors.New("not in the pool")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastErr
}

// capabilities calls the node's CSI Controller through the pool.
func (e *env) capabilities(node string) error {
	c, err := e.pool.Controller(e.t.Context(), node)
	if err != nil {
		return err
	}
	_, err = c.ControllerGetCapabilities(e.t.Context(), &csi.ControllerGetCapabilitiesRequest{})
	return err
}

// nextCapacity is the next OnCapacity call.
func (e *env) nextCapacity() capEvent {
	e.t.Helper()
	select {
	case c := <-e.caps:
		return c
	case <-time.After(10 * time.Second):
		e.t.Fatal("no OnCapacity call")
		return capEvent{}
	}
}

func TestEnrollment(t *testing.T) {
	const node, pod, uid = "node-a", "carve-node-abcde", types.UID("uid-a")
	tests := []struct {
		name    string
		claims  string // the node the agent names; node when empty
		review  func(*authv1.TokenReviewStatus)
		present string // the agent presents this node's certificate after the install
		wantErr string // empty: the verified connection works
	}{
		{name: "enrolled"},
		{name: "token's node differs", review: func(st *authv1.TokenReviewStatus) { st.User.Extra[extraNodeName] = []string{"node-b"} },
			wantErr: `token's pod is on node "node-b", the endpoint is on node "node-a"`},
		{name: "token names no node", review: func(st *authv1.TokenReviewStatus) { delete(st.User.Extra, extraNodeName) },
			wantErr: "token names no node"},
		{name: "another service account", review: func(st *authv1.TokenReviewStatus) { st.User.Username = "system:serviceaccount:carve:default" },
			wantErr: `token of "system:serviceaccount:carve:default"`},
		{name: "another pod", review: func(st *authv1.TokenReviewStatus) { st.User.Extra[extraPodName] = []string{"intruder"} },
			wantErr: `token bound to pod "intruder"`},
		{name: "another pod UID", review: func(st *authv1.TokenReviewStatus) { st.User.Extra[extraPodUID] = []string{"uid-old"} },
			wantErr: `token bound to pod UID "uid-old"`},
		{name: "not authenticated", review: func(st *authv1.TokenReviewStatus) { st.Authenticated, st.Error = false, "token expired" },
			wantErr: "token not authenticated (token expired)"},
		{name: "another audience", review: func(st *authv1.TokenReviewStatus) { st.Audiences = []string{"https://kubernetes.default.svc"} },
			wantErr: `lack "carve-controller"`},
		{name: "agent claims another node", claims: "node-b",
			wantErr: `the agent claims node "node-b", its endpoint is on node "node-a"`},
		{name: "agent presents another node's certificate", present: "node-b",
			wantErr: "want exactly carve://node/node-a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 0)
			f := e.agent(node, pod, uid, tt.review)
			if tt.claims != "" {
				f.claims = tt.claims
			}
			if tt.present != "" {
				other, err := e.iss.IssueNode(tt.present)
				if err != nil {
					t.Fatal(err)
				}
				f.present = other
			}
			e.publish("s1", node, pod, uid, f)
			e.run()

			if tt.wantErr == "" {
				eventually(t, "a verified connection", func() bool { return e.lastErr(node) == nil })
				if err := e.capabilities(node); err != nil {
					t.Fatalf("ControllerGetCapabilities through the pool: %v", err)
				}
				if got := testutil.ToFloat64(e.pool.enrollments.WithLabelValues(resultSuccess)); got != 1 {
					t.Errorf("successful enrollments = %v, want 1", got)
				}
				return
			}
			eventually(t, "the refusal", func() bool {
				err := e.lastErr(node)
				return err != nil && strings.Contains(err.Error(), tt.wantErr)
			})
			err := e.capabilities(node)
			if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Controller(%s) = %v, want ErrUnreachable naming %q", node, err, tt.wantErr)
			}
			if tt.present == "" {
				if n := f.installs.Load(); n != 0 {
					t.Errorf("%d certificates installed on a refused agent", n)
				}
				if got := testutil.ToFloat64(e.pool.enrollments.WithLabelValues(resultRefused)); got < 1 {
					t.Errorf("refused enrollments = %v, want at least 1", got)
				}
			}
			// Refusals are retried with backoff, never in a busy loop.
			before := f.enrolls.Load()
			time.Sleep(300 * time.Millisecond)
			if n := f.enrolls.Load() - before; n > 4 {
				t.Errorf("%d enrollments in 300 ms (backoff 20 ms to 200 ms)", n)
			}
		})
	}
}

func TestCapacityAndRemoval(t *testing.T) {
	const node = "node-a"
	e, f := runOneAgent(t, node)

	if got := e.nextCapacity(); got.node != node || got.r.GetClasses()[0].GetAvailableBytes() != 1<<30 {
		t.Fatalf("first OnCapacity = %s %v, want %s with the agent's report", got.node, got.r, node)
	}
	f.reports <- &nodeagentv1.CapacityReport{NodeName: node, Classes: []*nodeagentv1.ClassCapacity{{DeviceClass: "thin", AvailableBytes: 5}}}
	if got := e.nextCapacity(); got.node != node || got.r.GetClasses()[0].GetAvailableBytes() != 5 {
		t.Fatalf("second OnCapacity = %s %v, want %s with 5 bytes", got.node, got.r, node)
	}
	// A report naming another node is dropped.
	f.reports <- &nodeagentv1.CapacityReport{NodeName: "node-b"}
	f.reports <- &nodeagentv1.CapacityReport{NodeName: node, Classes: []*nodeagentv1.ClassCapacity{{DeviceClass: "thin", AvailableBytes: 7}}}
	if got := e.nextCapacity(); got.r.GetNodeName() != node || got.r.GetClasses()[0].GetAvailableBytes() != 7 {
		t.Fatalf("third OnCapacity = %s %v, want %s with 7 bytes", got.node, got.r, node)
	}
	// A stream that ends is opened again; the agent sends its capacity at once.
	f.end <- struct{}{}
	if got := e.nextCapacity(); got.node != node || got.r.GetClasses()[0].GetAvailableBytes() != 1<<30 {
		t.Fatalf("OnCapacity after the stream ended = %s %v, want the agent's first report again", got.node, got.r)
	}
	if got := e.pool.Names(); len(got) != 1 || got[0] != node {
		t.Errorf("Names() = %v, want [%s]", got, node)
	}
	if err := e.capabilities(node); err != nil {
		t.Fatalf("ControllerGetCapabilities: %v", err)
	}
	na, err := e.pool.NodeAgent(t.Context(), node)
	if err != nil || na == nil {
		t.Fatalf("NodeAgent(%s) = %v, %v", node, na, err)
	}

	if err := e.client.DiscoveryV1().EndpointSlices(testNS).Delete(t.Context(), "s1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := e.nextCapacity(); got.node != node || got.r != nil {
		t.Fatalf("OnCapacity after the endpoint left = %s %v, want %s nil", got.node, got.r, node)
	}
	if err := e.capabilities(node); !errors.Is(err, ErrUnreachable) {
		t.Errorf("Controller after the endpoint left: %v, want ErrUnreachable", err)
	}
	if _, err := e.pool.NodeAgent(t.Context(), node); !errors.Is(err, ErrUnreachable) {
		t.Errorf("NodeAgent after the endpoint left: %v, want ErrUnreachable", err)
	}
	if got := e.pool.Names(); len(got) != 0 {
		t.Errorf("Names() = %v, want none", got)
	}
}

// TestRenewal: with certificates of 2 s the agent is enrolled again about
// every second, and calls keep working through the swaps.
func TestRenewal(t *testing.T) {
	e := newEnv(t, 2*time.Second)
	const node, pod, uid = "node-a", "carve-node-abcde", types.UID("uid-a")
	f := e.agent(node, pod, uid, nil)
	e.publish("s1", node, pod, uid, f)
	e.run()
	eventually(t, "three enrollments", func() bool { return f.installs.Load() >= 3 })
	eventually(t, "a verified connection", func() bool { return e.lastErr(node) == nil })
	if err := e.capabilities(node); err != nil {
		t.Fatalf("ControllerGetCapabilities after renewals: %v", err)
	}
}

// TestReconnect: an agent that restarts (a new key, its bootstrap
// certificate) is enrolled again, and its capacity stream resumes.
func TestReconnect(t *testing.T) {
	const node = "node-a"
	e, f := runOneAgent(t, node)
	eventually(t, "a verified connection", func() bool { return e.lastErr(node) == nil })
	e.nextCapacity()

	e.restart(f)
	eventually(t, "a second enrollment", func() bool { return f.installs.Load() == 2 })
	eventually(t, "a verified connection", func() bool { return e.lastErr(node) == nil })
	if err := e.capabilities(node); err != nil {
		t.Fatalf("ControllerGetCapabilities after the restart: %v", err)
	}
	if got := e.nextCapacity(); got.node != node || got.r == nil {
		t.Errorf("OnCapacity after the restart = %s %v, want a report of %s", got.node, got.r, node)
	}
}

// TestEndpointChange: a node's endpoint that names a new pod gets a new
// connection, and the node never leaves the pool on the way.
func TestEndpointChange(t *testing.T) {
	e := newEnv(t, 0)
	const node = "node-a"
	f1, f2 := e.twoPods(node)
	e.publish("s1", node, "pod-1", "uid-1", f1)
	e.run()
	eventually(t, "a verified connection", func() bool { return e.lastErr(node) == nil })

	e.publish("s1", node, "pod-2", "uid-2", f2)
	eventually(t, "the new pod's enrollment", func() bool { return f2.installs.Load() == 1 })
	eventually(t, "a verified connection", func() bool { return e.lastErr(node) == nil })
	if err := e.capabilities(node); err != nil {
		t.Fatalf("ControllerGetCapabilities: %v", err)
	}
	if n := f1.installs.Load(); n != 1 {
		t.Errorf("old pod enrolled %d times, want 1", n)
	}
	for len(e.caps) > 0 {
		if c := <-e.caps; c.r == nil {
			t.Errorf("OnCapacity(%s, nil) while the node kept an endpoint", c.node)
		}
	}
}

// TestContestedNode: two pods claiming one node are both refused.
func TestContestedNode(t *testing.T) {
	e := newEnv(t, 0)
	const node = "node-a"
	f1, f2 := e.twoPods(node)
	e.publish("s1", node, "pod-1", "uid-1", f1)
	e.publish("s2", node, "pod-2", "uid-2", f2)
	e.run()
	err := e.capabilities(node)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "two node agent pods") {
		t.Errorf("Controller(%s) = %v, want ErrUnreachable naming two pods", node, err)
	}
	if n := f1.enrolls.Load() + f2.enrolls.Load(); n != 0 {
		t.Errorf("%d enrollments of a contested node", n)
	}
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	_, err := New(Config{Namespace: testNS})
	if err == nil || !strings.Contains(err.Error(), "Client") || !strings.Contains(err.Error(), "Audience") {
		t.Errorf("New with an incomplete config: %v, want an error naming the missing fields", err)
	}
}

// TestUnreachableOnlyAfterAnAttempt: a node whose agent the pool has not
// tried yet (the list not read, the first enrollment not ended) is not
// ErrUnreachable, so the router does not move a claim off a node that may
// be fine; after a failed enrollment it is.
func TestUnreachableOnlyAfterAnAttempt(t *testing.T) {
	p := &Pool{synced: make(chan struct{}), agents: map[string]*agent{}}
	if _, err := p.conn("node-a"); err == nil || errors.Is(err, ErrUnreachable) {
		t.Errorf("before the list: %v, want an error that is not ErrUnreachable", err)
	}
	close(p.synced)
	if _, err := p.conn("node-a"); !errors.Is(err, ErrUnreachable) {
		t.Errorf("a node without an endpoint: %v, want ErrUnreachable", err)
	}
	a := newAgent(p, endpoint{})
	p.agents["node-a"] = a
	if _, err := p.conn("node-a"); err == nil || errors.Is(err, ErrUnreachable) {
		t.Errorf("before the first enrollment ended: %v, want an error that is not ErrUnreachable", err)
	}
	a.set(nil, errors.New("refused"))
	if _, err := p.conn("node-a"); !errors.Is(err, ErrUnreachable) {
		t.Errorf("after a failed enrollment: %v, want ErrUnreachable", err)
	}
}

// TestKeyRequestsCarryTheVerifiedNode: the pool opens a VolumeKeys stream
// to each connected agent and answers its requests with OnKeyRequest,
// naming the node of the verified connection (not anything the agent
// says).
func TestKeyRequestsCarryTheVerifiedNode(t *testing.T) {
	_, f := runOneAgent(t, "node-a")
	select {
	case a := <-f.keyAnswers:
		if a.GetRequestId() != 3 || a.GetRefused() != "asked by node-a for vg/carve-aa" {
			t.Errorf("answer %+v", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to the agent's key request")
	}
}
