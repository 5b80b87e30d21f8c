// Package mover moves a bound carve claim to another node: `kubectl carve
// move` asks for it with the annotation carve.dev/move-to on the claim,
// and the controller's leader carries it out.
//
// A move keeps all its state in annotations on the claim's old
// PersistentVolume (the claim itself is deleted on the way; the PV
// survives because the mover sets its reclaim policy to Retain first and
// remembers the original), so a controller that crashes at any step
// resumes where it was. Its phases:
//
//   - seeding: a snapshot of the volume on its node (the seed), then a
//     volume on the target node restored from it through the router (the
//     copy across nodes); the workload keeps running.
//   - stopping: the claim is saved in an annotation and deleted; kube-
//     scheduler refuses to start a pod on a claim being deleted, so a
//     replacement pod cannot start on the old volume; the pods that use
//     it are deleted (gracefully) and the claim goes once none does.
//   - catching-up: what changed since the seed is sent to the target
//     (CatchUp), once the source is no longer open on its node.
//   - binding: a new PV for the target volume, pre-bound to the claim by
//     namespace and name (no UID), and the claim made again from the
//     saved one with volumeName set, unless something (a StatefulSet)
//     made it again first: the PV controller binds either to the
//     pre-bound PV, never to a fresh empty volume. While a move is past
//     seeding, the router refuses to provision a claim of its name
//     (Claims).
//   - cleaning: once the claim is bound to the new PV, the seed, the old
//     volume and the old PV are deleted; Event Moved.
//
// Every name is derived from the old PV and the target node (the seed's
// also from when the move began), so each step repeated after a crash
// finds what it made before, and a move asked again never takes what an
// earlier one left for its own. Before stopping, an abort (the annotation
// removed from the claim) or a failure that retrying cannot mend deletes
// the target and the seed and gives the old PV its reclaim policy back:
// the original is untouched and in use. After stopping started, such a
// failure rolls back: the old PV is pre-bound to the claim again and the
// claim made again on it. Neither deletes the target or the seed unless
// the old volume's node vouches for it (there, whole); else the move
// parks, keeping both (park.go).
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

// Results: carve_moves_total's result label.
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
// snapshots through; *router.Server is one. Each call is idempotent by
// name (create) or ID (delete), as the CSI spec asks. A CreateVolume
// whose copy an earlier call started and still runs is ABORTED with the
// ErrorInfo reason moveapi.ErrorCopyInProgress.
type Volumes interface {
	CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error)
	DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error)
	CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error)
	DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error)
	// DeleteVolumeOn deletes a volume on node and asks no other node:
	// the move's target, which no PV names yet. UNAVAILABLE: node is not
	// connected, nothing is known.
	DeleteVolumeOn(ctx context.Context, node string, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error)
	// ControllerGetVolumeOn asks node only about a volume: NOT_FOUND, it
	// is not there; UNAVAILABLE, node is not connected.
	ControllerGetVolumeOn(ctx context.Context, node string, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error)
}

// CatchUp sends a volume's changes since a snapshot of it to a volume
// restored from that snapshot on targetNode; *router.Server is one. The
// target is looked for on targetNode only: UNAVAILABLE when that node is
// not connected. FAILED_PRECONDITION: the source is still open on its
// node (its pod's volume not unstaged yet), which the mover retries, or,
// with an ErrorInfo reason (moveapi's Error*), a refusal no retry mends.
type CatchUp interface {
	CatchUpCopy(ctx context.Context, sourceVolumeID, baseSnapshotID, targetNode, targetVolumeID string) (received int64, err error)
}

// Config is what the mover needs; main builds it.
type Config struct {
	// Client reads and writes claims, PVs, pods, StorageClasses and
	// CSIStorageCapacity objects.
	Client kubernetes.Interface
	// Objects is the process's cache of claims and PVs, whose changes
	// queue moves.
	Objects *objects.Cache
	// Driver is carve's CSI driver name.
	Driver string
	// TopologyKey is the key of carve's node topology (topology.Key).
	TopologyKey string
	// CapacityNamespace holds the CSIStorageCapacity objects carve
	// controller writes (the target node's room); "" reads every namespace.
	CapacityNamespace string
	// Volumes makes and deletes the target volume and the seed.
	Volumes Volumes
	// CatchUp sends the last changes.
	CatchUp CatchUp
	// Events records each step on the claim and the old PV.
	Events record.EventRecorder
	// Registerer, when set, gets carve_moves_total,
	// carve_move_phase_seconds, carve_move_catch_up_bytes,
	// carve_move_catch_up_seconds and carve_moves_parked.
	Registerer prometheus.Registerer
	// Poll is how often a move that waits looks again (default 2s).
	Poll time.Duration
	// Retries is how often a failing step of a move whose workload
	// stopped is retried, each after a backoff doubling from baseDelay to
	// maxDelay, before the move gives up: it rolls back, or parks when
	// the old volume cannot be vouched for (default maxRetries, about 35
	// minutes).
	Retries int
}

// Retries: a step failing with a code worth retrying is retried with a
// backoff from baseDelay to maxDelay, Config.Retries times (maxRetries,
// about 35 minutes, by default), then the move gives up (roll back, or
// park); before the workload stops,
// giving up costs nothing (the claim is untouched; ask again), so the
// seeding gives up after maxSeedRetries (about a minute).
const (
	baseDelay      = time.Second
	maxDelay       = time.Minute
	maxRetries     = 40
	maxSeedRetries = 6
	// workers serve the moves (one key is never run twice at once); a
	// seed's copy holds none while it runs (seedcopy.go), a catch-up
	// holds its worker.
	workers     = 4
	defaultPoll = 2 * time.Second
	// copyTimeout bounds the seed's copy and the catch-up: a copy runs at
	// the disks' and network's pace, and a large volume takes hours.
	copyTimeout = 12 * time.Hour
)

// Mover runs the moves.
type Mover struct {
	cfg    Config
	queue  loop.Queue[string]
	moves  *prometheus.CounterVec
	phases *prometheus.HistogramVec
	// catchUpBytes and catchUpSeconds are each move's catch-up: the bytes it
	// sent and how long the copy itself took (the catching-up phase
	// also waits for the source to close).
	catchUpBytes   prometheus.Histogram
	catchUpSeconds prometheus.Histogram
	// parked are the old PVs whose move is parked.
	parked *parkedMoves
	// seeds are the seeds' copies in flight; seedWait is how long the
	// step that starts one waits for its answer (seedAnswerWait).
	seeds    *seedCopies
	seedWait time.Duration
	started  atomic.Bool
	now      func() time.Time
}

// New checks cfg and returns a Mover; its metrics are registered at once.
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

// Run watches the claims and PVs and moves until ctx ends. It may be
// called once.
func (m *Mover) Run(ctx context.Context) error {
	if !m.started.CompareAndSwap(false, true) {
		return errors.New("mover: Run called twice")
	}
	log := klog.FromContext(ctx).WithName("mover")
	ctx = klog.NewContext(ctx, log)
	defer m.queue.ShutDown()
	// Another leader counts the parked moves once this one stops.
	defer m.parked.reset()
	claims, pvs := m.cfg.Objects.Claims(), m.cfg.Objects.PersistentVolumes()
	// Only what starts, withdraws, aborts or advances a move queues it:
	// a step that waits looks again by itself (Poll), and one that failed
	// after its backoff; the move's own writes (what it waits for) must
	// not bypass that backoff.
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

// sync looks at one queued claim or PV.
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

// hashOf is the short hash the move's names carry.
func hashOf(pvName, node string) string {
	h := sha256.Sum256([]byte(pvName + "\x00" + node))
	return hex.EncodeToString(h[:8])
}

// TargetName is the CSI name of the target volume of a move of the PV
// to node, and the new PV's name.
func TargetName(pvName, node string) string { return "carve-moved-" + hashOf(pvName, node) }

// SeedName is the CSI name of the seed snapshot of a move of the PV to
// node that began at since (moveapi.AnnSeedName keeps it): each move has
// its own seed, so a target volume left by an earlier move to the node
// (same CSI name, other seed) does not match this move's CreateVolume.
// since "" is the name of a move begun before seeds had their own.
func SeedName(pvName, node, since string) string {
	if since == "" {
		return "carve-move-seed-" + hashOf(pvName, node)
	}
	return "carve-move-seed-" + hashOf(pvName, node+"\x00"+since)
}
