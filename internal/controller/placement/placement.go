// Package placement puts a new restore or clone of a carve volume on its
// source's node, where it is made in place rather than copied over the
// network (docs/backup-restore.md). Once a pod waits for such an unbound
// claim, the leader sets volume.kubernetes.io/selected-node to the source's
// node if every pending pod fits it (podfit) and it has room. The patch
// carries the resourceVersion, so a scheduler's earlier choice stands, and
// writes carve.dev/placed-with-source, so a node refusing the volume leads
// to the scheduler choosing rather than a loop.
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
	// AnnSelectedNode is the node selected for a WaitForFirstConsumer claim.
	AnnSelectedNode = "volume.kubernetes.io/selected-node"
	// AnnPlaced is the node carve selected once; it never selects again.
	AnnPlaced = "carve.dev/placed-with-source"
)

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

// Results are carve_restore_placements_total's result label.
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

// A claim whose source's node is not known or reachable yet is retried with
// backoff (about three minutes in all); changes of the claim or its source
// look again at once.
const (
	baseDelay  = 500 * time.Millisecond
	maxDelay   = 30 * time.Second
	maxRetries = 10
	workers    = 2
	// takenBackDelay is far longer than csi-provisioner takes to update its
	// cache (onClaimUpdate).
	takenBackDelay = 2 * time.Second
)

// Capacity is the room the agents last reported; *capacity.Writer is one.
type Capacity interface {
	// MaxVolume is the largest volume the node's device class ("" default) can
	// make; ok is false when the agent has not reported.
	MaxVolume(node, deviceClass string) (bytes int64, ok bool)
}

// PVs finds PersistentVolumes by name; *pvindex.Index is one.
type PVs interface {
	// Get returns the PV, nil when none; an error when not known yet.
	Get(name string) (*corev1.PersistentVolume, error)
}

// Config is what the placer needs.
type Config struct {
	// Client watches pending pods, lists a node's pods and patches claims.
	Client kubernetes.Interface
	// Objects is the process's cache of claims, StorageClasses and Nodes.
	Objects *objects.Cache
	// Dynamic watches VolumeSnapshots and VolumeSnapshotContents.
	Dynamic dynamic.Interface
	// Driver is carve's CSI driver name.
	Driver string
	// TopologyKey is carve's node topology key.
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
	pods       cache.SharedIndexInformer
	snapshots  cache.SharedIndexInformer
	contents   cache.SharedIndexInformer

	takenBackDelay time.Duration

	mu sync.Mutex
	// told is each claim's last Event result, so a claim gets one only when the
	// answer changes.
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
	// Not the snapshot informers: without the CRDs they never sync, and clones
	// still need placing; a restore seen early is retried (sourceNode).
	if !cache.WaitForCacheSync(ctx.Done(), p.claims.HasSynced, p.classes.HasSynced, p.nodes.HasSynced, p.pods.HasSynced) {
		return nil
	}
	log.Info("Placing new restores and clones on their source's node")
	stop := loop.Workers(ctx, p.queue, workers, p.syncKey)
	<-ctx.Done()
	stop()
	return nil
}

// snapshotsCheck is how often a missing snapshot API is looked for again.
const snapshotsCheck = time.Minute

// startSnapshots starts the snapshot informers once the API serves them;
// without the CRDs watching would only fail.
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

// syncKey places one claim; a decision that must wait retries with backoff.
func (p *Placer) syncKey(ctx context.Context, k string, attempt int) (loop.Result, error) {
	out, err := p.sync(ctx, k)
	return loop.Result{Again: err == nil && out.retry && attempt < maxRetries}, err
}
