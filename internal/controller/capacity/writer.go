// Package capacity writes the CSIStorageCapacity objects the scheduler reads
// (per node and carve WaitForFirstConsumer class) from the agents' capacity
// reports, writing only what differs. The objects are the scheduler's only
// view of carve's nodes, so after a restart or leader change existing ones
// are kept until the node reports or StartupGrace passes. Deletions are held
// while lost nodes outnumber reporting ones, since this replica's own reach
// may be at fault (held.go); a hold past the grace ends Run with
// ErrDeletionsHeld, giving up the Lease.
package capacity

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/loop"
	"github.com/carve-csi/carve/internal/volume"
)

// DefaultStartupGrace is how long after Run starts a silent node's objects
// are kept.
const DefaultStartupGrace = time.Minute

// defaultWorkers: one slow API call must not hold back other nodes.
const defaultWorkers = 2

// The queue keeps only the newest wish per (node, class), so a retry writes
// the capacity current at the time.
const (
	baseDelay = 200 * time.Millisecond
	maxDelay  = time.Minute
)

// Config is what the writer needs.
type Config struct {
	// Client writes CSIStorageCapacity objects and watches StorageClasses.
	Client kubernetes.Interface
	// Namespace is where the objects live.
	Namespace string
	// Driver is carve's CSI driver name: only its StorageClasses get objects.
	Driver string
	// TopologyKey is carve's node topology key.
	TopologyKey string
	// Registerer, when set, gets the writer's metrics.
	Registerer prometheus.Registerer
	// StartupGrace is how long silent nodes' objects are kept after Run starts,
	// how long drops count as together, and how long deletions are held before
	// ErrDeletionsHeld; 0 means DefaultStartupGrace.
	StartupGrace time.Duration
	// Owner, when set, owns every object so they are garbage-collected with it.
	Owner *metav1.OwnerReference
	// Workers is how many writes may be in flight; 0 means 2.
	Workers int
}

// Writer keeps carve's CSIStorageCapacity objects in line with the reports.
type Writer struct {
	cfg       Config
	selector  labels.Set      // on every object of this writer
	sel       labels.Selector // selector, parsed
	writes    *prometheus.CounterVec
	heldGauge prometheus.Gauge

	// s is the current (or next) Run's session; running says a Run is under way.
	s       atomic.Pointer[session]
	running atomic.Bool

	mu sync.Mutex
	// nodes holds each node's last report; nil is a node reported gone, kept
	// until the grace ends so it is not taken for one not heard from yet.
	nodes     map[string]*nodeCapacity
	classes   map[string]string
	graceOver bool
	// drops holds when nodes dropped with objects to lose; cleared by a report,
	// forgotten after the grace.
	drops     map[string]time.Time
	held      bool
	heldSince time.Time

	// pending holds own writes the informer has not shown yet (see settle).
	pmu     sync.Mutex
	pending map[string]pendingWrite
}

// session is one Run's: informers and queues cannot restart once stopped,
// and a writer that gave up its Lease runs again when it leads again.
type session struct {
	queue                 loop.Queue[item]
	scFactory, objFactory informers.SharedInformerFactory
	scReg, objReg         cache.ResourceEventHandlerRegistration
	objects               cache.Indexer
	spent                 bool
}

type nodeCapacity struct {
	classes map[string]classCapacity
	def     string
}

type classCapacity struct {
	available, maxVolume int64
}

// New returns a Writer; Run starts it. Report may be called before Run.
func New(cfg Config) (*Writer, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("capacity writer: Client is required")
	case cfg.Namespace == "":
		return nil, errors.New("capacity writer: Namespace is required")
	case cfg.TopologyKey == "":
		return nil, errors.New("capacity writer: TopologyKey is required")
	case cfg.StartupGrace < 0:
		return nil, fmt.Errorf("capacity writer: StartupGrace %s must not be negative", cfg.StartupGrace)
	}
	if errs := validation.IsValidLabelValue(cfg.Driver); cfg.Driver == "" || len(errs) > 0 {
		return nil, fmt.Errorf("capacity writer: Driver %q must be a valid label value: %v", cfg.Driver, errs)
	}
	if cfg.StartupGrace == 0 {
		cfg.StartupGrace = DefaultStartupGrace
	}
	if cfg.Workers <= 0 {
		cfg.Workers = defaultWorkers
	}
	w := &Writer{
		cfg:      cfg,
		selector: labels.Set{LabelManagedBy: ManagedBy, LabelDriver: cfg.Driver},
		sel:      labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy, LabelDriver: cfg.Driver}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_capacity_object_writes_total",
			Help: "Writes of CSIStorageCapacity objects by carve controller, by op (create, update or delete) and result (success, conflict: the writer's view was stale and it looks again, or error).",
		}, []string{"op", "result"}),
		heldGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_capacity_deletions_held",
			Help: "1 while carve controller's capacity writer holds back deletions of CSIStorageCapacity objects because the nodes that would lose their objects at once outnumber the nodes that report (it reaches no node, or most dropped together), else 0; 0 on a replica that does not write.",
		}),
		nodes:   map[string]*nodeCapacity{},
		classes: map[string]string{},
		drops:   map[string]time.Time{},
		pending: map[string]pendingWrite{},
	}
	for _, op := range []string{opCreate, opUpdate, opDelete} {
		for _, r := range []string{resultSuccess, resultConflict, resultError} {
			w.writes.WithLabelValues(op, r)
		}
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{w.writes, w.heldGauge} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("capacity writer metrics: %w", err)
			}
		}
	}
	s, err := w.newSession()
	if err != nil {
		return nil, err
	}
	w.s.Store(s)
	return w, nil
}

func (w *Writer) newSession() (*session, error) {
	s := &session{queue: loop.NewQueue[item](baseDelay, maxDelay)}
	s.scFactory = informers.NewSharedInformerFactoryWithOptions(w.cfg.Client, 0, informers.WithTransform(trimStorageClass))
	scs := s.scFactory.Storage().V1().StorageClasses().Informer()
	var err error
	s.scReg, err = scs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onStorageClass(o, false) },
		UpdateFunc: func(_, o any) { w.onStorageClass(o, false) },
		DeleteFunc: func(o any) { w.onStorageClass(o, true) },
	})
	if err != nil {
		return nil, fmt.Errorf("capacity writer: watching StorageClasses: %w", err)
	}

	s.objFactory = informers.NewSharedInformerFactoryWithOptions(w.cfg.Client, 0,
		informers.WithNamespace(w.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = w.selector.String() }))
	objs := s.objFactory.Storage().V1().CSIStorageCapacities().Informer()
	if err := objs.AddIndexers(cache.Indexers{
		indexKey:  w.indexBy(func(k key) string { return k.String() }),
		indexNode: w.indexBy(func(k key) string { return k.node }),
		indexSC:   w.indexBy(func(k key) string { return k.sc }),
	}); err != nil {
		return nil, fmt.Errorf("capacity writer: indexing CSIStorageCapacities: %w", err)
	}
	s.objects = objs.GetIndexer()
	enqueue := func(o any, deleted bool) {
		if c := w.ours(o); c != nil {
			w.observe(c, deleted)
			s.queue.Add(w.itemOf(c))
		}
	}
	s.objReg, err = objs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { enqueue(o, false) },
		UpdateFunc: func(_, o any) { enqueue(o, false) },
		DeleteFunc: func(o any) { enqueue(o, true) },
	})
	if err != nil {
		return nil, fmt.Errorf("capacity writer: watching CSIStorageCapacities: %w", err)
	}
	return s, nil
}

// Run writes until ctx ends or its deletions were held for the grace
// (an error wrapping ErrDeletionsHeld; objects stay). Run may be called
// again; each Run starts with a grace, as after a restart.
func (w *Writer) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("capacity writer: Run called while it runs")
	}
	defer w.running.Store(false)
	log := klog.FromContext(ctx).WithName("capacity")
	ctx = klog.NewContext(ctx, log)
	s := w.s.Load()
	if s.spent {
		var err error
		if s, err = w.newSession(); err != nil {
			return err
		}
	}
	s.spent = true
	w.begin()
	w.s.Store(s)
	defer w.stopHolding()
	defer s.queue.ShutDown()
	grace := time.NewTimer(w.cfg.StartupGrace)
	defer grace.Stop()

	// Run may end before ctx: the informers stop before Shutdown waits for them.
	ctx, cancel := context.WithCancel(ctx)
	defer s.scFactory.Shutdown()
	defer s.objFactory.Shutdown()
	defer cancel()
	s.scFactory.Start(ctx.Done())
	s.objFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.scReg.HasSynced, s.objReg.HasSynced) {
		return nil
	}
	w.mu.Lock()
	classes := len(w.classes)
	w.mu.Unlock()
	log.Info("Writing CSIStorageCapacity objects", "namespace", w.cfg.Namespace, "storageClasses", classes,
		"existingObjects", len(s.objects.List()), "startupGrace", w.cfg.StartupGrace)

	stop := loop.Workers(ctx, s.queue, w.cfg.Workers, w.syncItem)
	err := w.watchHealth(ctx, grace)
	stop()
	return err
}

// begin forgets the last Run's StorageClasses (the new informer tells them
// again, deletions included) and grace.
func (w *Writer) begin() {
	w.mu.Lock()
	clear(w.classes)
	clear(w.drops)
	w.graceOver = false
	w.mu.Unlock()
	w.pmu.Lock()
	clear(w.pending)
	w.pmu.Unlock()
}

func (w *Writer) endGrace(ctx context.Context) {
	s := w.s.Load()
	now := time.Now()
	w.mu.Lock()
	w.graceOver = true
	maps.DeleteFunc(w.nodes, func(_ string, n *nodeCapacity) bool { return n == nil })
	for _, node := range s.objects.ListIndexFuncValues(indexNode) {
		if w.nodes[node] == nil {
			w.drops[node] = now
		}
	}
	w.mu.Unlock()
	objs := s.objects.List()
	klog.FromContext(ctx).V(2).Info("Startup grace over: objects of nodes that have not reported go", "objects", len(objs))
	w.enqueueAll(s)
}

func (w *Writer) enqueueAll(s *session) {
	for _, o := range s.objects.List() {
		if c := w.ours(o); c != nil {
			s.queue.Add(w.itemOf(c))
		}
	}
}

// Report records node's capacity; nil means the node left and its objects go. node must
// be the identity the channel verified, not the report's node_name. It never blocks.
func (w *Writer) Report(node string, r *nodeagentv1.CapacityReport) {
	if node == "" {
		return
	}
	now := fromReport(r)
	s := w.s.Load()
	w.mu.Lock()
	old, seen := w.nodes[node]
	if seen && now.equal(old) {
		w.mu.Unlock()
		return
	}
	if now == nil && w.graceOver {
		delete(w.nodes, node)
	} else {
		w.nodes[node] = now
	}
	switch {
	case now != nil:
		delete(w.drops, node)
	case old != nil || w.hasObjects(s, node):
		w.drops[node] = time.Now()
	}
	scs := make([]string, 0, len(w.classes))
	for sc := range w.classes {
		scs = append(scs, sc)
	}
	w.mu.Unlock()
	for _, sc := range scs {
		s.queue.Add(item{key: key{node: node, sc: sc}})
	}
	// Objects of classes the writer no longer counts are its own too.
	w.enqueueIndexed(s, indexNode, node)
}

func (w *Writer) enqueueIndexed(s *session, index, value string) {
	objs, err := s.objects.ByIndex(index, value)
	if err != nil {
		return // only an unknown index fails; the indexes are fixed above
	}
	for _, o := range objs {
		if c := w.ours(o); c != nil {
			s.queue.Add(w.itemOf(c))
		}
	}
}

// fromReport is what r says, nil for nil; an unavailable class holds
// nothing and negative figures count as 0.
func fromReport(r *nodeagentv1.CapacityReport) *nodeCapacity {
	if r == nil {
		return nil
	}
	n := &nodeCapacity{classes: make(map[string]classCapacity, len(r.GetClasses()))}
	for _, c := range r.GetClasses() {
		var cc classCapacity
		if c.GetUnavailable() == "" {
			cc = classCapacity{available: max(c.GetAvailableBytes(), 0), maxVolume: max(c.GetMaximumVolumeBytes(), 0)}
		}
		n.classes[c.GetDeviceClass()] = cc
		if c.GetIsDefault() && n.def == "" {
			n.def = c.GetDeviceClass()
		}
	}
	return n
}

func (n *nodeCapacity) equal(o *nodeCapacity) bool {
	if n == nil || o == nil {
		return n == o
	}
	return n.def == o.def && maps.Equal(n.classes, o.classes)
}

func (w *Writer) onStorageClass(o any, deleted bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o, deleted = d.Obj, true
	}
	sc, ok := o.(*storagev1.StorageClass)
	if !ok {
		return
	}
	dc, counts := w.classOf(sc)
	counts = counts && !deleted
	w.mu.Lock()
	old, had := w.classes[sc.Name]
	if counts {
		w.classes[sc.Name] = dc
	} else {
		delete(w.classes, sc.Name)
	}
	changed := had != counts || old != dc
	var nodes []string
	if changed && counts {
		for n := range w.nodes {
			nodes = append(nodes, n)
		}
	}
	w.mu.Unlock()
	if !changed {
		return
	}
	s := w.s.Load()
	for _, n := range nodes {
		s.queue.Add(item{key: key{node: n, sc: sc.Name}})
	}
	w.enqueueIndexed(s, indexSC, sc.Name)
}

// classOf is the device class sc names ("" default) and whether it gets
// objects.
func (w *Writer) classOf(sc *storagev1.StorageClass) (string, bool) {
	if sc.Provisioner != w.cfg.Driver || sc.VolumeBindingMode == nil ||
		*sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
		return "", false
	}
	return sc.Parameters[volume.ParamDeviceClass], true
}

func trimStorageClass(o any) (any, error) {
	sc, ok := o.(*storagev1.StorageClass)
	if !ok {
		return o, nil
	}
	out := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: sc.Name, UID: sc.UID, ResourceVersion: sc.ResourceVersion},
		Provisioner:       sc.Provisioner,
		VolumeBindingMode: sc.VolumeBindingMode,
	}
	if dc, ok := sc.Parameters[volume.ParamDeviceClass]; ok {
		out.Parameters = map[string]string{volume.ParamDeviceClass: dc}
	}
	return out, nil
}

// desired is what k's object should hold; nil with act true: it should not
// exist; act false: leave it (its node not reported within the grace, or
// deletions held); after > 0: look again then (its node just dropped).
func (w *Writer) desired(ctx context.Context, k key) (want *classCapacity, act bool, after time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	dc, counts := w.classes[k.sc]
	n, seen := w.nodes[k.node]
	switch {
	case !counts:
		return nil, true, 0
	case !seen && !w.graceOver:
		return nil, false, 0
	case n == nil:
		return w.goneLocked(ctx, k.node)
	}
	if dc == "" {
		dc = n.def
	}
	c := n.classes[dc] // a class the node lacks, or no default: 0
	return &c, true, 0
}

// MaxVolume is the largest volume the node's class ("" default) can make per its last
// report; ok is false when unknown. It answers on every replica, leader or not.
func (w *Writer) MaxVolume(node, deviceClass string) (bytes int64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nodes[node]
	if n == nil {
		return 0, false
	}
	if deviceClass == "" {
		deviceClass = n.def
	}
	return n.classes[deviceClass].maxVolume, true
}
