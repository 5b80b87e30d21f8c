// Package mover moves a bound carve claim to another node when the claim
// carries carve.dev/move-to (`kubectl carve move`); the leader does the work.
// All state lives in annotations on the old PV (set to Retain first), and
// every name derives from the old PV and target node, so a crashed
// controller resumes and finds what it made. Phases: seeding, stopping,
// catching-up, binding, cleaning. Failures abort before stopping and roll
// back after; nothing is deleted unless the old volume's node vouches for
// it, else the move parks (park.go). docs/architecture.md has the design.
package mover

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/controller/loop"
	"github.com/carve-csi/carve/internal/controller/objects"
)

// Results are carve_moves_total's result label.
const (
	ResultMoved      = "moved"
	ResultAborted    = "aborted"
	ResultFailed     = "failed"
	ResultRolledBack = "rolled_back"
	ResultRefused    = "refused"
	ResultSalvaged   = "salvaged"
)

var results = []string{ResultMoved, ResultAborted, ResultFailed, ResultRolledBack, ResultRefused, ResultSalvaged}

// Volumes is the CSI Controller the mover makes and deletes volumes and
// snapshots through; *router.Server is one. Calls are idempotent by name or
// ID; a CreateVolume whose copy still runs is ABORTED with reason
// moveapi.ErrorCopyInProgress.
type Volumes interface {
	CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error)
	DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error)
	CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error)
	DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error)
	// DeleteVolumeOn deletes a volume on node only; UNAVAILABLE when not
	// connected.
	DeleteVolumeOn(ctx context.Context, node string, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error)
	// ControllerGetVolumeOn asks node only; UNAVAILABLE when not connected.
	ControllerGetVolumeOn(ctx context.Context, node string, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error)
}

// CatchUp sends a volume's changes since a snapshot to the volume restored
// from it on targetNode; *router.Server is one. FAILED_PRECONDITION without
// an ErrorInfo reason means the source is still open (retried); with a
// moveapi Error* reason it is a refusal no retry mends.
type CatchUp interface {
	CatchUpCopy(ctx context.Context, sourceVolumeID, baseSnapshotID, targetNode, targetVolumeID string) (received int64, err error)
}

// Config is what the mover needs; main builds it.
type Config struct {
	// Client reads and writes claims, PVs, pods, StorageClasses and capacities.
	Client kubernetes.Interface
	// Objects is the cache of claims and PVs whose changes queue moves.
	Objects *objects.Cache
	// Driver is carve's CSI driver name.
	Driver string
	// TopologyKey is carve's node topology key.
	TopologyKey string
	// CapacityNamespace holds carve's CSIStorageCapacity objects; "" reads all.
	CapacityNamespace string
	// Volumes makes and deletes the target volume and the seed.
	Volumes Volumes
	// CatchUp sends the last changes.
	CatchUp CatchUp
	// Events records each step on the claim and the old PV.
	Events record.EventRecorder
	// Registerer, when set, gets the carve_move* metrics.
	Registerer prometheus.Registerer
	// Poll is how often a move that waits looks again (default 2s).
	Poll time.Duration
	// Retries is how often a failing step after the workload stopped is
	// retried with backoff before the move rolls back or parks.
	Retries int
}

// Before the workload stops giving up costs nothing (the claim is
// untouched), so seeding gives up after maxSeedRetries (about a minute);
// later steps retry Config.Retries times (about 35 minutes by default).
const (
	baseDelay      = time.Second
	maxDelay       = time.Minute
	maxRetries     = 40
	maxSeedRetries = 6
	// workers serve the moves; a seed's copy holds none while it runs
	// (seedcopy.go), a catch-up holds its worker.
	workers     = 4
	defaultPoll = 2 * time.Second
	// copyTimeout bounds a copy: a large volume takes hours.
	copyTimeout = 12 * time.Hour
)

// Mover runs the moves.
type Mover struct {
	cfg    Config
	queue  loop.Queue[string]
	moves  *prometheus.CounterVec
	phases *prometheus.HistogramVec
	// catchUpBytes and catchUpSeconds measure the copy itself, not the wait
	// for the source to close.
	catchUpBytes   prometheus.Histogram
	catchUpSeconds prometheus.Histogram
	parked         *parkedMoves
	// seedWait is how long the step starting a seed copy waits for its answer.
	seeds    *seedCopies
	seedWait time.Duration
	started  atomic.Bool
	now      func() time.Time
}

// New checks cfg and returns a Mover with its metrics registered.
func New(cfg Config) (*Mover, error) {
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"Client", cfg.Client != nil}, {"Objects", cfg.Objects != nil}, {"Driver", cfg.Driver != ""}, {"TopologyKey", cfg.TopologyKey != ""},
		{"Volumes", cfg.Volumes != nil}, {"CatchUp", cfg.CatchUp != nil}, {"Events", cfg.Events != nil},
	} {
		if !f.ok {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("mover: %v required", missing)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = defaultPoll
	}
	if cfg.Retries <= 0 {
		cfg.Retries = maxRetries
	}
	m := &Mover{
		cfg:   cfg,
		queue: loop.NewQueue[string](baseDelay, maxDelay),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_moves_total",
			Help: "Moves of claims to another node (kubectl carve move) that ended, by result: moved, aborted (asked to), failed (given up before the workload stopped; the original untouched), rolled_back (given up after; the claim bound to its old volume again), refused (never started), salvaged (a parked move bound to its target as of the seed, as asked).",
		}, []string{"result"}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "carve_move_phase_seconds",
			Help:    "How long each phase of a move took (seeding, stopping, catching-up, binding, cleaning); stopping to binding is the workload's downtime.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 16),
		}, []string{"phase"}),
		catchUpBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "carve_move_catch_up_bytes",
			Help:    "What each move's catch-up sent to the target: the data that changed on the volume since the seed, while the workload was stopped.",
			Buckets: prometheus.ExponentialBuckets(64<<10, 4, 12),
		}),
		catchUpSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "carve_move_catch_up_seconds",
			Help:    "How long each move's catch-up copy took, without the wait for the source to close that carve_move_phase_seconds{phase=\"catching-up\"} also counts.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 16),
		}),
		parked: &parkedMoves{pvs: map[string]bool{}, gauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_moves_parked",
			Help: "Moves that are parked: their old volume could not be vouched for (its node does not answer, or the volume is gone), so the target and the seed, which may hold the only copy, are kept. 0 on a replica that does not lead.",
		})},
		seeds:    newSeedCopies(),
		seedWait: seedAnswerWait,
		now:      time.Now,
	}
	for _, r := range results {
		m.moves.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.moves, m.phases, m.catchUpBytes, m.catchUpSeconds, m.parked.gauge} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("mover: registering its metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Queue keys: a claim that asks for a move, a PV whose move runs.
const (
	claimKey = "claim/"
	pvKey    = "pv/"
)

// Run moves until ctx ends. It may be called once.
func (m *Mover) Run(ctx context.Context) error {
	if !m.started.CompareAndSwap(false, true) {
		return errors.New("mover: Run called twice")
	}
	log := klog.FromContext(ctx).WithName("mover")
	ctx = klog.NewContext(ctx, log)
	defer m.queue.ShutDown()
	defer m.parked.reset()
	claims, pvs := m.cfg.Objects.Claims(), m.cfg.Objects.PersistentVolumes()
	// Only what starts, withdraws, aborts or advances a move queues it; the
	// move's own writes must not bypass the backoff of a failed step.
	claimAnn := func(o any) (string, string, bool) {
		c, ok := o.(*corev1.PersistentVolumeClaim)
		if !ok {
			return "", "", false
		}
		return c.Namespace + "/" + c.Name, c.Annotations[moveapi.AnnMoveTo], true
	}
	pvAnn := func(o any) (string, string, bool) {
		pv, ok := o.(*corev1.PersistentVolume)
		if !ok {
			return "", "", false
		}
		return pv.Name, pv.Annotations[moveapi.AnnPhase] + "\x00" + pv.Annotations[moveapi.AnnAbort], true
	}
	for _, h := range []struct {
		inf    cache.SharedIndexInformer
		prefix string
		of     func(any) (string, string, bool)
	}{{claims, claimKey, claimAnn}, {pvs, pvKey, pvAnn}} {
		reg, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) {
				if k, v, ok := h.of(o); ok && v != "" && v != "\x00" {
					m.queue.Add(h.prefix + k)
				}
			},
			UpdateFunc: func(old, o any) {
				_, before, _ := h.of(old)
				if k, v, ok := h.of(o); ok && v != before {
					m.queue.Add(h.prefix + k)
				}
			},
		})
		if err != nil {
			return fmt.Errorf("mover: watching: %w", err)
		}
		defer func() { _ = h.inf.RemoveEventHandler(reg) }() // fails only once the informer stopped
	}
	m.cfg.Objects.Start()
	if !cache.WaitForCacheSync(ctx.Done(), claims.HasSynced, pvs.HasSynced) {
		return nil
	}
	log.Info("Moving claims that ask for it", "annotation", moveapi.AnnMoveTo)
	stop := loop.Workers(ctx, m.queue, workers, m.sync)
	<-ctx.Done()
	stop()
	return nil
}

func (m *Mover) sync(ctx context.Context, k string, attempt int) (loop.Result, error) {
	var (
		after time.Duration
		err   error
	)
	switch {
	case strings.HasPrefix(k, claimKey) && len(k) > len(claimKey):
		after, err = m.syncClaim(ctx, k[len(claimKey):])
	case strings.HasPrefix(k, pvKey) && len(k) > len(pvKey):
		after, err = m.syncPV(ctx, k[len(pvKey):], attempt)
	}
	return loop.Result{After: after}, err
}

func hashOf(pvName, node string) string {
	h := sha256.Sum256([]byte(pvName + "\x00" + node))
	return hex.EncodeToString(h[:8])
}

// TargetName is the CSI name of the move's target volume and the new PV.
func TargetName(pvName, node string) string { return "carve-moved-" + hashOf(pvName, node) }

// SeedName is the CSI name of the move's seed snapshot. since makes each
// move's seed its own, so a target left by an earlier move (other seed)
// does not match this move's CreateVolume; since "" is the legacy name.
func SeedName(pvName, node, since string) string {
	if since == "" {
		return "carve-move-seed-" + hashOf(pvName, node)
	}
	return "carve-move-seed-" + hashOf(pvName, node+"\x00"+since)
}
