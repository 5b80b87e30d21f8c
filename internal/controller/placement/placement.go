// Package placement puts a new restore or clone of a carve volume on its
// source's node, when the pod that waits for it can run there, before the
// scheduler chooses a node: there it is made in place (a thin snapshot of a
// thin source is instant), anywhere else it is copied over the network,
// which takes as long as the data (docs/backup-restore.md).
//
// The leader watches the unbound claims of carve's WaitForFirstConsumer
// classes whose source is a carve VolumeSnapshot or PVC. Once a pending pod
// uses such a claim and no node is selected, it sets
// volume.kubernetes.io/selected-node to the source's node when every pending
// pod of the claim can run there (package podfit: the scheduler's own rules
// for labels, affinity, taints, pinned claims and resources) and the node's
// last capacity report has room; otherwise the scheduler chooses and the
// restore is copied. The patch carries the claim's resourceVersion, so a
// choice the scheduler made first stands.
//
// The same patch writes carve.dev/placed-with-source, and a claim that
// carries it is never placed again: when the node refuses the volume,
// csi-provisioner takes the selection back and the scheduler chooses,
// rather than carve and the node refusing in a loop. A claim created with
// it opts out.
//
// Each decision is an Event on the claim (PlacedWithSource, or NotPlaced
// with its reason first) and a count in carve_restore_placements_total.
package placement

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/controller/loop"
	"github.com/carve-csi/carve/internal/controller/objects"
)

// Annotations on the claim.
const (
	// AnnSelectedNode is the node the scheduler (or carve) selected for a
	// WaitForFirstConsumer claim; the PV controller provisions on it.
	AnnSelectedNode = "volume.kubernetes.io/selected-node"
	// AnnPlaced is the node carve selected once for the claim; carve
	// does not select a node for the claim again.
	AnnPlaced = "carve.dev/placed-with-source"
)

// The snapshot API's resources.
var (
	VolumeSnapshots        = schema.GroupVersionResource{Group: snapshotGroup, Version: "v1", Resource: "volumesnapshots"}
	VolumeSnapshotContents = schema.GroupVersionResource{Group: snapshotGroup, Version: "v1", Resource: "volumesnapshotcontents"}
)

const snapshotGroup = "snapshot.storage.k8s.io"

// Event reasons.
const (
	ReasonPlaced    = "PlacedWithSource"
	ReasonNotPlaced = "NotPlaced"
)

// Results: the values of carve_restore_placements_total's result label.
const (
	ResultPlaced                = "placed"
	ResultSourceNodeFull        = "source_node_full"
	ResultSourceNodeUnreachable = "source_node_unreachable"
	ResultSourceNodeUnknown     = "source_node_unknown"
	ResultSourceNotCarve        = "source_not_carve"
	ResultPlacedBefore          = "placed_before"
	ResultPodCannotRun          = "pod_cannot_run_there"
)

var results = []string{ResultPlaced, ResultSourceNodeFull, ResultSourceNodeUnreachable,
	ResultSourceNodeUnknown, ResultSourceNotCarve, ResultPlacedBefore, ResultPodCannotRun}

// Retries of a claim whose source's node is not known or not reachable
// yet back off from baseDelay to maxDelay, maxRetries times (about three
// minutes in all); a change of the claim, its source claim, snapshot or
// snapshot content looks again at once.
const (
	baseDelay  = 500 * time.Millisecond
	maxDelay   = 30 * time.Second
	maxRetries = 10
	workers    = 2
	// takenBackDelay is how long a claim whose selected node was taken
	// back waits before carve selects one (onClaimUpdate): far longer
	// than csi-provisioner takes to write its cache after its update.
	takenBackDelay = 2 * time.Second
)

// Capacity is the room the node agents last reported;
// *capacity.Writer satisfies it.
type Capacity interface {
	// MaxVolume is the largest volume the node's device class can make
	// now ("" is the node's default class); ok is false when the node's
	// agent has not reported (it is not connected).
	MaxVolume(node, deviceClass string) (bytes int64, ok bool)
}

// PVs finds PersistentVolumes by name; *pvindex.Index satisfies it.
type PVs interface {
	// Get returns the PV (a PV of another driver has no Spec.CSI), nil
	// when there is none; an error when the answer is not known yet.
	Get(name string) (*corev1.PersistentVolume, error)
}

// Config is what the placer needs; main builds it.
type Config struct {
	// Client watches the pods that wait for a node, lists the pods on a
	// source's node, and patches claims.
	Client kubernetes.Interface
	// Objects is the process's cache of claims, StorageClasses and Nodes.
	Objects *objects.Cache
	// Dynamic watches VolumeSnapshots and VolumeSnapshotContents.
	Dynamic dynamic.Interface
	// Driver is carve's CSI driver name.
	Driver string
	// TopologyKey is the node label of carve's topology (topology.Key),
	// the key of a carve PV's node affinity.
	TopologyKey string
	// Capacity is the nodes' room.
	Capacity Capacity
	// PVs finds a clone source's PV.
	PVs PVs
	// Events records the decisions on the claims.
	Events record.EventRecorder
	// Registerer, when set, gets carve_restore_placements_total.
	Registerer prometheus.Registerer
}

// Placer selects the source's node for new restores and clones.
type Placer struct {
	cfg       Config
	queue     loop.Queue[string]
	decisions *prometheus.CounterVec
	started   atomic.Bool

	podFactory informers.SharedInformerFactory
	dyn        dynamicinformer.DynamicSharedInformerFactory
	claims     cache.SharedIndexInformer
	classes    cache.SharedIndexInformer
	nodes      cache.SharedIndexInformer
	// pods are the pods no node is chosen for yet.
	pods      cache.SharedIndexInformer
	snapshots cache.SharedIndexInformer
	contents  cache.SharedIndexInformer

	takenBackDelay time.Duration

	mu sync.Mutex
	// told is the last result each claim got an Event for, so that a
	// claim looked at again gets one only when the answer changes.
	told map[types.UID]string
}

// New checks cfg and sets up the informers; Run starts them.
func New(cfg Config) (*Placer, error) {
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"Client", cfg.Client != nil}, {"Objects", cfg.Objects != nil}, {"Dynamic", cfg.Dynamic != nil}, {"Driver", cfg.Driver != ""},
		{"TopologyKey", cfg.TopologyKey != ""}, {"Capacity", cfg.Capacity != nil}, {"PVs", cfg.PVs != nil},
		{"Events", cfg.Events != nil},
	} {
		if !f.ok {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("restore placement: %v required", missing)
	}
	p := &Placer{
		cfg:   cfg,
		queue: loop.NewQueue[string](baseDelay, maxDelay),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_restore_placements_total",
			Help: "Decisions of carve controller on new restores and clones of carve volumes, by result: placed (the claim's node selected: its source's), or why not: source_node_full, source_node_unreachable, source_node_unknown, source_not_carve, placed_before, pod_cannot_run_there.",
		}, []string{"result"}),
		told:           map[types.UID]string{},
		takenBackDelay: takenBackDelay,
	}
	for _, r := range results {
		p.decisions.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(p.decisions); err != nil {
			return nil, fmt.Errorf("register carve_restore_placements_total: %w", err)
		}
	}
	if err := p.setupInformers(); err != nil {
		return nil, err
	}
	return p, nil
}

// Run watches and decides until ctx ends. It may be called once.
func (p *Placer) Run(ctx context.Context) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("restore placement: Run called twice")
	}
	log := klog.FromContext(ctx).WithName("placement")
	ctx = klog.NewContext(ctx, log)
	defer p.queue.ShutDown()
	stopWatching, err := p.watchShared()
	if err != nil {
		return err
	}
	defer stopWatching()
	p.cfg.Objects.Start()
	p.podFactory.Start(ctx.Done())
	defer p.podFactory.Shutdown()
	var snaps sync.WaitGroup
	snaps.Go(func() { p.startSnapshots(ctx) })
	defer snaps.Wait()
	defer p.dyn.Shutdown()
	// Not the snapshot informers: without the snapshot CRDs they never
	// sync, and clones still need placing. A restore seen before they
	// have synced is looked at again (sourceNode).
	if !cache.WaitForCacheSync(ctx.Done(), p.claims.HasSynced, p.classes.HasSynced, p.nodes.HasSynced, p.pods.HasSynced) {
		return nil
	}
	log.Info("Placing new restores and clones on their source's node")
	stop := loop.Workers(ctx, p.queue, workers, p.syncKey)
	<-ctx.Done()
	stop()
	return nil
}

// snapshotsCheck is how often the API server is asked whether it serves
// the snapshot API, while it does not.
const snapshotsCheck = time.Minute

// startSnapshots starts the snapshot informers once the API server serves
// the snapshot API (a cluster without the snapshot CRDs: watching them
// would only fail, over and over).
func (p *Placer) startSnapshots(ctx context.Context) {
	logged := false
	for {
		l, err := p.cfg.Client.Discovery().ServerResourcesForGroupVersion(VolumeSnapshots.GroupVersion().String())
		if err == nil && served(l, VolumeSnapshots.Resource) && served(l, VolumeSnapshotContents.Resource) {
			p.dyn.Start(ctx.Done())
			return
		}
		if !logged {
			klog.FromContext(ctx).Info("The API server does not serve the snapshot API; restores are placed once it does",
				"groupVersion", VolumeSnapshots.GroupVersion().String(), "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(snapshotsCheck):
		}
	}
}

func served(l *metav1.APIResourceList, resource string) bool {
	for _, r := range l.APIResources {
		if r.Name == resource {
			return true
		}
	}
	return false
}

// syncKey places one claim; a claim whose decision must wait is looked
// at again with backoff, at most maxRetries times.
func (p *Placer) syncKey(ctx context.Context, k string, attempt int) (loop.Result, error) {
	out, err := p.sync(ctx, k)
	return loop.Result{Again: err == nil && out.retry && attempt < maxRetries}, err
}
