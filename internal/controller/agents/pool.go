package agents

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/internal/nodeca"
)

// ErrUnreachable is wrapped when the pool has no verified connection to the
// node: nothing was sent. It is the router's sentinel, for errors.Is.
var ErrUnreachable = router.ErrUnreachable

// Config is what the pool needs.
type Config struct {
	// Client reads EndpointSlices and creates TokenReviews.
	Client kubernetes.Interface
	// Namespace holds the agents' headless Service and pods.
	Namespace string
	// Service is the headless Service's name.
	Service string
	// PortName is the EndpointSlice port name of the node channel.
	PortName string
	// ServiceAccount is the agents' service account; others' tokens are refused.
	ServiceAccount string
	// Audience is the audience of the agents' projected tokens.
	Audience string
	// Issuer signs the nodes' certificate requests.
	Issuer *nodeca.Issuer
	// Identity is the controller's client certificate (carve://controller).
	Identity *nodeca.Keypair
	// Trust holds the CAs a node certificate must chain to.
	Trust *nodeca.Pool
	// OnCapacity receives each node's capacity reports, and nil once the node
	// left the pool (a new pod or address stays in it). Calls for one node
	// never overlap, and the nil call comes last. Nothing is called when Run
	// ends (the next leader reports). Nil ignores reports.
	OnCapacity func(node string, r *nodeagentv1.CapacityReport)
	// OnKeyRequest answers an agent's volume key request on the VolumeKeys
	// stream; node is the verified connection's identity. Nil opens no stream.
	OnKeyRequest func(ctx context.Context, node string, req *nodeagentv1.VolumeKeyRequest) *nodeagentv1.VolumeKeyAnswer
	// Registerer, when set, gets carve_node_enrollments_total.
	Registerer prometheus.Registerer
}

func (c Config) validate() error {
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"Client", c.Client != nil}, {"Namespace", c.Namespace != ""}, {"Service", c.Service != ""},
		{"PortName", c.PortName != ""}, {"ServiceAccount", c.ServiceAccount != ""}, {"Audience", c.Audience != ""},
		{"Issuer", c.Issuer != nil}, {"Identity", c.Identity != nil}, {"Trust", c.Trust != nil},
	} {
		if !f.ok {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("node pool config: %v required", missing)
	}
	return nil
}

// Enrollment results, carve_node_enrollments_total's label values.
const (
	resultSuccess = "success"
	resultRefused = "refused"
	resultError   = "error"
)

// Pool keeps one verified connection per node agent.
type Pool struct {
	cfg             Config
	t               timing
	enrollments     *prometheus.CounterVec
	certExpiry      *prometheus.GaugeVec
	running         atomic.Bool
	identityChanged chan struct{}
	synced          chan struct{}
	enrollSlots     chan struct{} // one token per enrollment under way

	mu         sync.Mutex
	agents     map[string]*agent     // by node: the pool's members
	contested  map[string][]endpoint // nodes refused for two pods, as last logged
	syncedOnce sync.Once
}

// New checks cfg and returns a Pool; Run starts it.
func New(cfg Config) (*Pool, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.OnCapacity == nil {
		cfg.OnCapacity = func(string, *nodeagentv1.CapacityReport) {}
	}
	p := &Pool{cfg: cfg, t: defaultTiming(), synced: make(chan struct{}), enrollSlots: make(chan struct{}, maxEnrolling),
		agents: map[string]*agent{}, contested: map[string][]endpoint{}, identityChanged: make(chan struct{}, 1),
		certExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_node_channel_certificate_expiry_timestamp_seconds",
			Help: "When the node channel's certificates expire (Unix seconds): the controller's own (role controller) and each connected node's (role node); each is renewed at half its life.",
		}, []string{"role", "node"}),
		enrollments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_node_enrollments_total",
			Help: "Enrollments of node agents by carve controller, by result: success, refused (the agent's token did not match its endpoint), error (the agent or the API server failed).",
		}, []string{"result"}),
	}
	for _, r := range []string{resultSuccess, resultRefused, resultError} {
		p.enrollments.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{p.enrollments, p.certExpiry} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("node pool metrics: %w", err)
			}
		}
	}
	return p, nil
}

// Run keeps a connection to every ready agent until ctx ends, then closes
// them. It may be called once.
func (p *Pool) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("node pool: Run called twice")
	}
	log := klog.FromContext(ctx).WithName("agents")
	ctx = klog.NewContext(ctx, log)
	selector := labels.Set{discoveryv1.LabelServiceName: p.cfg.Service}.String()
	factory := informers.NewSharedInformerFactoryWithOptions(p.cfg.Client, 0,
		informers.WithNamespace(p.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := factory.Discovery().V1().EndpointSlices().Informer()
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	}); err != nil {
		return fmt.Errorf("watching EndpointSlices: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	defer p.stopAll()
	identityDone := make(chan struct{})
	go func() {
		defer close(identityDone)
		p.keepIdentity(ctx)
	}()
	defer func() { <-identityDone }()
	log.Info("Watching node agents", "namespace", p.cfg.Namespace, "service", p.cfg.Service, "port", p.cfg.PortName)
	for {
		p.reconcile(ctx, inf.GetStore().List())
		p.syncedOnce.Do(func() { close(p.synced) })
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		}
	}
}

// WaitForSync waits until Run read the EndpointSlices and started each
// connection; false if ctx ended first.
func (p *Pool) WaitForSync(ctx context.Context) bool {
	select {
	case <-p.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

// Controller is the node agent's CSI Controller over the shared verified
// connection (ErrUnreachable when none); no call dials.
func (p *Pool) Controller(_ context.Context, node string) (csi.ControllerClient, error) {
	conn, err := p.conn(node)
	if err != nil {
		return nil, err
	}
	return csi.NewControllerClient(conn), nil
}

// NodeAgent is the node's NodeAgent service, as Controller.
func (p *Pool) NodeAgent(_ context.Context, node string) (nodeagentv1.NodeAgentClient, error) {
	conn, err := p.conn(node)
	if err != nil {
		return nil, err
	}
	return nodeagentv1.NewNodeAgentClient(conn), nil
}

// Host is the node agent's pod IP, where other agents reach its copy port
// (ErrUnreachable when unknown).
func (p *Pool) Host(node string) (string, error) {
	p.mu.Lock()
	a := p.agents[node]
	p.mu.Unlock()
	if a == nil {
		return "", fmt.Errorf("node %s: no ready node agent endpoint: %w", node, ErrUnreachable)
	}
	host, _, err := net.SplitHostPort(a.ep.Addr)
	if err != nil {
		return "", fmt.Errorf("node %s: endpoint address %q: %w", node, a.ep.Addr, err)
	}
	return host, nil
}

// Names lists the nodes with a ready agent endpoint, sorted.
func (p *Pool) Names() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.agents))
}

func (p *Pool) conn(node string) (*grpc.ClientConn, error) {
	select {
	case <-p.synced:
	default:
		// Not ErrUnreachable: the node may have an agent not listed yet.
		return nil, fmt.Errorf("node %s: the controller has not listed the node agents yet", node)
	}
	p.mu.Lock()
	a := p.agents[node]
	_, contested := p.contested[node]
	p.mu.Unlock()
	switch {
	case a != nil:
		return a.current(node)
	case contested:
		return nil, fmt.Errorf("node %s: two node agent pods claim it, both refused: %w", node, ErrUnreachable)
	default:
		return nil, fmt.Errorf("node %s: no ready node agent endpoint: %w", node, ErrUnreachable)
	}
}

func (p *Pool) reconcile(ctx context.Context, objs []any) {
	log := klog.FromContext(ctx)
	items := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			items = append(items, s)
		}
	}
	want, contested := endpointsOf(items, p.cfg.PortName)
	for node, eps := range contested {
		if !slices.Equal(p.contested[node], eps) {
			pods := make([]string, len(eps))
			for i, e := range eps {
				pods[i] = e.Pod + "@" + e.Addr
			}
			log.Error(nil, "Two node agent pods claim one node; refusing both until one is gone (a DaemonSet update with maxSurge, or a pod that is not carve's node agent matches the Service)",
				"node", node, "pods", pods)
		}
	}

	var stop []*agent
	var gone []string
	p.mu.Lock()
	p.contested = contested
	for node, a := range p.agents {
		e, ok := want[node]
		if ok && e == a.ep {
			continue
		}
		stop = append(stop, a)
		delete(p.agents, node)
		if !ok {
			gone = append(gone, node)
		}
	}
	var start []*agent
	for node, e := range want {
		if _, ok := p.agents[node]; !ok {
			a := newAgent(p, e)
			p.agents[node] = a
			start = append(start, a)
		}
	}
	p.mu.Unlock()

	// An agent stops before its successor starts, so one node's reports never
	// come from two connections.
	for _, a := range stop {
		a.stop()
	}
	for _, node := range gone {
		log.Info("Node agent left the pool", "node", node)
		p.certExpiry.DeleteLabelValues(roleNode, node)
		p.cfg.OnCapacity(node, nil)
	}
	for _, a := range start {
		log.Info("Node agent joined the pool", "node", a.ep.Node, "pod", a.ep.Pod, "address", a.ep.Addr)
		a.start(ctx)
	}
}

func (p *Pool) stopAll() {
	p.mu.Lock()
	agents := slices.Collect(maps.Values(p.agents))
	p.agents = map[string]*agent{}
	p.mu.Unlock()
	for _, a := range agents {
		a.stop()
	}
}

func (p *Pool) wantUser() string {
	return "system:serviceaccount:" + p.cfg.Namespace + ":" + p.cfg.ServiceAccount
}

func (p *Pool) countEnrollment(err error) {
	switch {
	case err == nil:
		p.enrollments.WithLabelValues(resultSuccess).Inc()
	case errors.Is(err, errRefused):
		p.enrollments.WithLabelValues(resultRefused).Inc()
	default:
		p.enrollments.WithLabelValues(resultError).Inc()
	}
}

const maxEnrolling = 8

// timing holds the pool's delays; tests shorten them.
type timing struct {
	minBackoff, maxBackoff time.Duration
	callTimeout            time.Duration
	// drainGrace is how long a replaced connection serves calls made on it.
	drainGrace time.Duration
}

func defaultTiming() timing {
	return timing{minBackoff: time.Second, maxBackoff: 30 * time.Second,
		callTimeout: 30 * time.Second, drainGrace: 2 * time.Minute}
}
