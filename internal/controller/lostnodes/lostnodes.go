// Package lostnodes reports carve PVs pinned to a node whose Node object
// was deleted (a metric, an Event per claim, a log line) and, only when
// asked, deletes the claims and PVs so a StatefulSet makes new volumes
// elsewhere. It never acts while the Node exists or before a grace period
// (a re-registered Node keeps its claims), nor on Retain PVs unless asked.
// The clock is in the leader's memory, so a new leader only delays.
package lostnodes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/controller/objects"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/topology/pinned"
)

// Event reasons.
const (
	ReasonNodeLost      = "NodeLost"
	ReasonClaimReleased = "NodeLostClaimDeleted"
)

// provisionerFinalizer: only the lost node's provisioner would lift it.
const provisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// Config is what the watch needs.
type Config struct {
	// Driver is carve's CSI driver name; TopologyKey its node-affinity key.
	Driver, TopologyKey string
	Client              kubernetes.Interface
	// Objects is the process's cache of Nodes and PVs.
	Objects *objects.Cache
	Events  record.EventRecorder
	// Interval is how often every PV is checked (finding Nodes deleted while no
	// replica led).
	Interval time.Duration
	// DeleteClaims deletes lost nodes' claims and PVs after Grace; off, only
	// reports.
	DeleteClaims bool
	// Grace is how long a Node must be absent before DeleteClaims acts.
	Grace time.Duration
	// DeleteRetained lets DeleteClaims delete Retain PVs and their claims too.
	DeleteRetained bool
	Registerer     prometheus.Registerer
}

// Volume is a carve PV pinned to a node.
type Volume struct {
	PV, Node string
	// Claim is the bound PVC, zero when unbound.
	ClaimNamespace, ClaimName string
	ClaimUID                  types.UID
	// Retain is true when the PV's reclaim policy is Retain.
	Retain bool
}

// Watch finds and handles the volumes of deleted nodes.
type Watch struct {
	cfg         Config
	lost        prometheus.Gauge
	deleted     *prometheus.CounterVec
	reported    map[string]bool // PV names already announced
	absentSince map[string]time.Time
}

// New returns a Watch with its metrics registered.
func New(cfg Config) *Watch {
	w := &Watch{cfg: cfg, reported: map[string]bool{}, absentSince: map[string]time.Time{},
		lost: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "carve_lost_node_volumes",
			Help: "PersistentVolumes of carve pinned to a node whose Node object no longer exists (their data went with the node).",
		}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_lost_node_volumes_deleted_total",
			Help: "Claims and PersistentVolumes of lost nodes deleted by carve controller (--delete-claims-of-lost-nodes only), by object (pvc or pv) and result (success or error).",
		}, []string{"object", "result"}),
	}
	cfg.Registerer.MustRegister(w.lost, w.deleted)
	for _, o := range []string{"pvc", "pv"} {
		for _, r := range []string{"success", "error"} {
			w.deleted.WithLabelValues(o, r)
		}
	}
	return w
}

// Run passes at every Node deletion and Interval until ctx ends.
func (w *Watch) Run(ctx context.Context) error {
	log := klog.FromContext(ctx).WithName("lostnodes")
	ctx = klog.NewContext(ctx, log)
	nodes, pvs := w.cfg.Objects.Nodes(), w.cfg.Objects.PersistentVolumes()
	kick := make(chan struct{}, 1)
	reg, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		return fmt.Errorf("watching Nodes: %w", err)
	}
	defer func() { _ = nodes.RemoveEventHandler(reg) }() // fails only once the informer stopped
	w.cfg.Objects.Start()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.HasSynced, pvs.HasSynced) {
		return nil
	}
	log.Info("Watching for the volumes of deleted nodes", "interval", w.cfg.Interval, "deleteClaims", w.cfg.DeleteClaims,
		"gracePeriod", w.cfg.Grace, "deleteRetained", w.cfg.DeleteRetained)
	tick := time.NewTicker(w.cfg.Interval)
	defer tick.Stop()
	for {
		existing := map[string]bool{}
		for _, o := range nodes.GetStore().List() {
			if n, ok := o.(*corev1.Node); ok {
				existing[n.Name] = true
			}
		}
		var vols []Volume
		for _, o := range pvs.GetStore().List() {
			if pv, ok := o.(*corev1.PersistentVolume); ok {
				if v, ok := VolumeOf(pv, w.cfg.Driver, w.cfg.TopologyKey); ok {
					vols = append(vols, v)
				}
			}
		}
		if err := w.Pass(ctx, time.Now(), vols, func(n string) bool { return existing[n] }); err != nil {
			log.Error(err, "Pass over the volumes of deleted nodes incomplete")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-kick:
		}
	}
}

// VolumeOf is the Volume of driver's PV pinned to a node on key; false
// otherwise or while it is being deleted.
func VolumeOf(pv *corev1.PersistentVolume, driver, key string) (Volume, bool) {
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver || pv.DeletionTimestamp != nil {
		return Volume{}, false
	}
	v := Volume{PV: pv.Name, Node: pinned.Node(pv, key)}
	if v.Node == "" {
		return Volume{}, false
	}
	if r := pv.Spec.ClaimRef; r != nil {
		v.ClaimNamespace, v.ClaimName, v.ClaimUID = r.Namespace, r.Name, r.UID
	}
	v.Retain = pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain
	return v, true
}

// Pass handles vols at now. Only a live NotFound makes a node lost; with DeleteClaims its
// volumes are released after the grace (Retain ones only with DeleteRetained).
func (w *Watch) Pass(ctx context.Context, now time.Time, vols []Volume, nodeExists func(string) bool) error {
	log := klog.FromContext(ctx)
	gone := map[string]bool{}
	unknown := map[string]bool{} // the API server did not answer
	var errs []error
	var lost []Volume
	for _, v := range vols {
		if nodeExists(v.Node) {
			continue
		}
		g, seen := gone[v.Node]
		if !seen {
			_, err := w.cfg.Client.CoreV1().Nodes().Get(ctx, v.Node, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				g = true
			case err != nil:
				unknown[v.Node] = true
				errs = append(errs, fmt.Errorf("looking up Node %s: %w", v.Node, err))
			}
			gone[v.Node] = g
		}
		if g {
			lost = append(lost, v)
		}
	}
	// A node found again or without volumes loses its clock; one the API server
	// could not answer for keeps it.
	for n := range w.absentSince {
		if !gone[n] && !unknown[n] {
			delete(w.absentSince, n)
		}
	}
	for n, g := range gone {
		if _, ok := w.absentSince[n]; g && !ok {
			w.absentSince[n] = now
		}
	}
	slices.SortFunc(lost, func(a, b Volume) int {
		if a.PV < b.PV {
			return -1
		}
		if a.PV > b.PV {
			return 1
		}
		return 0
	})
	w.lost.Set(float64(len(lost)))
	current := map[string]bool{}
	for _, v := range lost {
		current[v.PV] = true
		since := w.absentSince[v.Node]
		if !w.reported[v.PV] {
			w.reported[v.PV] = true
			w.announce(log, v, since)
		}
		switch {
		case !w.cfg.DeleteClaims:
		case v.Retain && !w.cfg.DeleteRetained:
		case now.Sub(since) < w.cfg.Grace:
			log.V(2).Info("Volume of a deleted node: waiting for the grace period before deleting its claim", "pv", v.PV, "node", v.Node,
				"absentSince", since.UTC().Format(time.RFC3339), "deleteAt", since.Add(w.cfg.Grace).UTC().Format(time.RFC3339))
		default:
			if err := w.release(ctx, v); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for pv := range w.reported {
		if !current[pv] {
			delete(w.reported, pv)
		}
	}
	return errors.Join(errs...)
}

func (w *Watch) claimRef(v Volume) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: v.ClaimNamespace, Name: v.ClaimName, UID: v.ClaimUID}
}

func (w *Watch) announce(log klog.Logger, v Volume, since time.Time) {
	claim := "none"
	if v.ClaimName != "" {
		claim = v.ClaimNamespace + "/" + v.ClaimName
	}
	deleteAt := since.Add(w.cfg.Grace).UTC().Format(time.RFC3339)
	log.Info("Volume of a deleted node: its data went with the node", "pv", v.PV, "node", v.Node, "claim", claim,
		"deleteClaims", w.cfg.DeleteClaims, "retain", v.Retain, "absentSince", since.UTC().Format(time.RFC3339))
	what := "delete this claim and its pod to get a new volume elsewhere (docs/operations.md: a node lost for good)"
	switch {
	case w.cfg.DeleteClaims && v.Retain && !w.cfg.DeleteRetained:
		what = "its PersistentVolume's reclaim policy is Retain, so carve does not delete it (--delete-retained-claims-of-lost-nodes would); " + what
	case w.cfg.DeleteClaims:
		what = fmt.Sprintf("unless Node %s comes back first, carve deletes this claim and the PV at %s (--delete-claims-of-lost-nodes, --lost-node-grace-period %v), "+
			"so that a StatefulSet makes a new, empty volume elsewhere", v.Node, deleteAt, w.cfg.Grace)
	}
	w.cfg.Events.Eventf(&corev1.ObjectReference{Kind: "PersistentVolume", APIVersion: "v1", Name: v.PV}, corev1.EventTypeWarning, ReasonNodeLost,
		"Node %s no longer exists; this volume lived on its disks and is lost", v.Node)
	if v.ClaimName != "" {
		w.cfg.Events.Eventf(w.claimRef(v), corev1.EventTypeWarning, ReasonNodeLost,
			"Node %s no longer exists; PersistentVolume %s of this claim lived on its disks and is lost: %s", v.Node, v.PV, what)
	}
}

// release deletes the lost volume's claim (by UID) and PV, and lifts
// csi-provisioner's finalizer.
func (w *Watch) release(ctx context.Context, v Volume) error {
	log := klog.FromContext(ctx)
	cs := w.cfg.Client.CoreV1()
	count := func(object string, err error) { w.deleted.WithLabelValues(object, metrics.Result(err)).Inc() }
	if v.ClaimName != "" {
		uid := v.ClaimUID
		err := w.deleteClaim(ctx, v.ClaimNamespace, v.ClaimName, uid)
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone, or a new claim of that name: not ours.
		case err != nil:
			count("pvc", err)
			return fmt.Errorf("deleting claim %s/%s of lost PV %s: %w", v.ClaimNamespace, v.ClaimName, v.PV, err)
		default:
			count("pvc", nil)
			log.Info("Deleted the claim of a volume of a deleted node", "pvc", v.ClaimNamespace+"/"+v.ClaimName, "pv", v.PV, "node", v.Node)
			w.cfg.Events.Eventf(w.claimRef(v), corev1.EventTypeNormal, ReasonClaimReleased,
				"deleted: its PersistentVolume %s was on deleted Node %s (--delete-claims-of-lost-nodes)", v.PV, v.Node)
		}
	}
	err := cs.PersistentVolumes().Delete(ctx, v.PV, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		count("pv", err)
		return fmt.Errorf("deleting lost PV %s: %w", v.PV, err)
	}
	if err == nil {
		count("pv", nil)
		log.Info("Deleted a PV of a deleted node", "pv", v.PV, "node", v.Node)
	}
	return w.dropFinalizer(ctx, v.PV)
}

// deleteClaim deletes ns/name only if its UID is uid (checked here and by
// the API server's precondition).
func (w *Watch) deleteClaim(ctx context.Context, ns, name string, uid types.UID) error {
	c, err := w.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if c.UID != uid {
		return apierrors.NewConflict(corev1.Resource("persistentvolumeclaims"), name, fmt.Errorf("UID %s, the lost PV was bound to %s", c.UID, uid))
	}
	return w.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
}

func (w *Watch) dropFinalizer(ctx context.Context, name string) error {
	pv, err := w.cfg.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading lost PV %s: %w", name, err)
	}
	i := slices.Index(pv.Finalizers, provisionerFinalizer)
	if i < 0 {
		return nil
	}
	pv.Finalizers = slices.Delete(pv.Finalizers, i, i+1)
	if _, err := w.cfg.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("lifting csi-provisioner's finalizer from lost PV %s: %w", name, err)
	}
	return nil
}
