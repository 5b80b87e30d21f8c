package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	carvemetrics "github.com/carve-csi/carve/pkg/metrics"
	"github.com/carve-csi/carve/topology"
)

// Event reasons.
const (
	ReasonOrphan        = "OrphanedVolume"
	ReasonOrphanRemoved = "OrphanedVolumeRemoved"
	ReasonMissing       = "VolumeDataMissing"
)

// Volumes is the node's LVM side: the in-memory view of its volume groups.
type Volumes interface {
	// Volumes lists carve's LVs (owner tag) in the configured volume
	// groups, as of the view's last refresh and carve's own mutations.
	Volumes() []LV
	// Readable tells whether the view holds a fresh read of volume group
	// vg (present, or known to be absent); false for a volume group that
	// is not configured, that LVM could not read, or before the first
	// read.
	Readable(vg string) bool
}

// Config is what the audit needs; main builds it.
type Config struct {
	// Node is this node's name; Driver carve's CSI driver name;
	// TopologyKey the node-affinity key of carve's PVs.
	Node, Driver, TopologyKey string
	Client                    kubernetes.Interface
	// PVs is the cache of carve's PVs.
	PVs     PVs
	Volumes Volumes
	// Classes are the configured device classes (the gauges show each).
	Classes []Class
	// Grace is how long an LV must lack a PV (a PV its LV) before it is
	// reported; Interval how often the audit runs.
	Grace, Interval time.Duration
	// Orphans tells which LVs are busy and removes orphans
	// (*provision.Provisioner); nil counts no LV busy and removes none.
	Orphans Orphans
	// RemoveOrphans removes an orphan once reported; false (the default,
	// without --remove-orphans) only reports.
	RemoveOrphans bool
	// Registerer takes the audit's metrics.
	Registerer prometheus.Registerer
	// Events records the Events.
	Events record.EventRecorder
}

// Orphans is what the audit needs of carve's volume lifecycle.
type Orphans interface {
	// Busy tells whether an operation on an LV name is in flight.
	Busy(lvName string) bool
	// RemoveOrphan removes an orphaned LV under carve's per-volume lock.
	RemoveOrphan(ctx context.Context, vg, name string) error
}

// Auditor runs the audit loop.
type Auditor struct {
	cfg     Config
	decider *Decider
	m       *metrics
	// reported holds what was already logged and announced as an Event,
	// so that each finding is announced once per plugin run.
	reported map[string]bool
}

// New returns an Auditor; its metrics are registered (at zero) at once.
func New(cfg Config) *Auditor {
	return &Auditor{cfg: cfg, decider: NewDecider(cfg.Grace), m: newMetrics(cfg.Registerer, cfg.Classes),
		reported: map[string]bool{}}
}

// PVs is the cache of carve's PersistentVolumes (pkg/pvindex).
type PVs interface {
	// WaitForSync waits until the cache holds its first full list; false
	// when ctx ended first.
	WaitForSync(ctx context.Context) bool
	// List returns carve's PVs, every node's.
	List() []*corev1.PersistentVolume
}

// Run audits every Interval until ctx ends, against the PV cache (which
// its owner runs). No audit runs until the cache is synced, so a cold
// cache never makes an orphan.
func (a *Auditor) Run(ctx context.Context) error {
	log := klog.FromContext(ctx).WithName("audit")
	ctx = klog.NewContext(ctx, log)
	if !a.cfg.PVs.WaitForSync(ctx) {
		return nil // ctx ended
	}
	log.Info("Auditing carve's LVs against the PersistentVolumes", "gracePeriod", a.cfg.Grace, "interval", a.cfg.Interval, "removeOrphans", a.removes())
	tick := time.NewTicker(a.cfg.Interval)
	defer tick.Stop()
	for {
		a.Pass(ctx, time.Now(), a.pvsOf(a.cfg.PVs.List()))
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// pvsOf turns carve's PVs into the decision's PVs.
func (a *Auditor) pvsOf(pvs []*corev1.PersistentVolume) []PV {
	var out []PV
	for _, pv := range pvs {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != a.cfg.Driver {
			continue
		}
		out = append(out, PVFrom(pv, a.cfg.TopologyKey))
	}
	return out
}

// PVFrom is the decision's view of a PersistentVolume of carve.
func PVFrom(pv *corev1.PersistentVolume, topologyKey string) PV {
	p := PV{Name: pv.Name, Node: topology.PinnedNode(pv, topologyKey),
		Going: pv.DeletionTimestamp != nil ||
			pv.Status.Phase == corev1.VolumeReleased && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete}
	if pv.Spec.CSI != nil {
		p.Handle = pv.Spec.CSI.VolumeHandle
	}
	if r := pv.Spec.ClaimRef; r != nil {
		p.Claim, p.ClaimUID = r.Namespace+"/"+r.Name, string(r.UID)
	}
	return p
}

// Pass runs one audit over pvs (carve's PVs, every node's) at now.
func (a *Auditor) Pass(ctx context.Context, now time.Time, pvs []PV) {
	log := klog.FromContext(ctx)
	orphans, missing := a.decider.Decide(Input{Now: now, LVs: a.cfg.Volumes.Volumes(), PVs: pvs, Node: a.cfg.Node,
		Readable: a.cfg.Volumes.Readable, Busy: a.busy()})
	var errs []error
	kept := orphans[:0]
	for _, o := range orphans {
		alive, err := a.claimAlive(ctx, o.LV)
		if err != nil {
			// Unknown: not reported this pass, and its clock runs on.
			errs = append(errs, err)
			continue
		}
		if alive {
			// csi-provisioner still wants it (a PV write failing for
			// long, say): not an orphan, and the clock starts anew.
			log.V(2).Info("LV without a PV, but its claim still exists; not an orphan", "lv", o.ID(), "claim", o.Claim)
			a.decider.Reset(o.ID())
			continue
		}
		kept = append(kept, o)
	}
	orphans = kept
	for _, o := range orphans {
		a.announceOrphan(log, o)
	}
	for _, x := range missing {
		a.announceMissing(log, x)
	}
	if a.removes() {
		var left []Orphan
		for _, o := range orphans {
			if err := a.remove(ctx, o); err != nil {
				errs = append(errs, err)
				left = append(left, o)
			}
		}
		orphans = left
	}
	a.m.publish(orphans, missing)
	a.forgetAnnounced(orphans, missing)
	a.m.ran(now, errors.Join(errs...))
	if err := errors.Join(errs...); err != nil {
		log.Error(err, "Audit pass incomplete")
	}
}

// claimAlive tells whether the PVC named by an orphan's tags still exists
// and is the one the volume was made for (csi-provisioner names a PV
// "pvc-<claim UID>"). An LV whose tags name no claim cannot be checked:
// false.
func (a *Auditor) claimAlive(ctx context.Context, lv LV) (bool, error) {
	ns, name, ok := cut(lv.Claim)
	if !ok {
		return false, nil
	}
	pvc, err := a.cfg.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking up claim %s of LV %s: %w", lv.Claim, lv.ID(), err)
	}
	return pvc.DeletionTimestamp == nil && lv.VolumeName == "pvc-"+string(pvc.UID), nil
}

func (a *Auditor) nodeRef() *corev1.ObjectReference {
	// The kubelet's own Events on a Node use its name as the UID.
	return &corev1.ObjectReference{Kind: "Node", Name: a.cfg.Node, UID: types.UID(a.cfg.Node), APIVersion: "v1"}
}

func (a *Auditor) announceOrphan(log klog.Logger, o Orphan) {
	key := "orphan/" + o.ID()
	if a.reported[key] {
		return
	}
	a.reported[key] = true
	claim := o.Claim
	if claim == "" {
		claim = "unknown (no claim tag)"
	}
	log.Info("Orphaned volume: no PersistentVolume points at this LV", "lv", o.ID(), "size", o.Size,
		"deviceClass", o.Class, "claim", claim, "volume", o.VolumeName, "since", o.Since.UTC().Format(time.RFC3339))
	a.cfg.Events.Eventf(a.nodeRef(), corev1.EventTypeWarning, ReasonOrphan,
		"LV %s (%d bytes, device class %s) has had no PersistentVolume since %s; it was made for claim %s (volume %s). See carve's operations runbook: orphaned volumes",
		o.ID(), o.Size, o.Class, o.Since.UTC().Format(time.RFC3339), claim, o.VolumeName)
}

func (a *Auditor) announceMissing(log klog.Logger, x Missing) {
	key := "missing/" + x.Name
	if a.reported[key] {
		return
	}
	a.reported[key] = true
	log.Error(nil, "Volume data missing: the LV of this PersistentVolume is gone from the volume group", "pv", x.Name,
		"lv", x.Handle, "claim", x.Claim, "since", x.Since.UTC().Format(time.RFC3339))
	msg := fmt.Sprintf("the LV %s of PersistentVolume %s is gone from node %s's volume group since %s (disk replaced or volume group made anew?); its data is lost. See carve's operations runbook: missing data",
		x.Handle, x.Name, a.cfg.Node, x.Since.UTC().Format(time.RFC3339))
	a.cfg.Events.Event(&corev1.ObjectReference{Kind: "PersistentVolume", Name: x.Name, APIVersion: "v1"},
		corev1.EventTypeWarning, ReasonMissing, msg)
	if ns, name, ok := cut(x.Claim); ok {
		a.cfg.Events.Event(&corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name,
			UID: types.UID(x.ClaimUID), APIVersion: "v1"}, corev1.EventTypeWarning, ReasonMissing, msg)
	}
}

// forgetAnnounced drops what is no longer found, so that it is announced
// again if it comes back.
func (a *Auditor) forgetAnnounced(orphans []Orphan, missing []Missing) {
	now := map[string]bool{}
	for _, o := range orphans {
		now["orphan/"+o.ID()] = true
	}
	for _, x := range missing {
		now["missing/"+x.Name] = true
	}
	for k := range a.reported {
		if !now[k] {
			delete(a.reported, k)
		}
	}
}

// removes tells whether the audit removes the orphans it reports.
func (a *Auditor) removes() bool { return a.cfg.RemoveOrphans && a.cfg.Orphans != nil }

// busy is the Decider's Busy (nil without Orphans).
func (a *Auditor) busy() func(string) bool {
	if a.cfg.Orphans == nil {
		return nil
	}
	return a.cfg.Orphans.Busy
}

// remove removes one orphan (only with --remove-orphans).
func (a *Auditor) remove(ctx context.Context, o Orphan) error {
	log := klog.FromContext(ctx)
	err := a.cfg.Orphans.RemoveOrphan(ctx, o.VolumeGroup, o.Name)
	a.m.removed.WithLabelValues(o.Class, o.VolumeGroup, carvemetrics.Result(err)).Inc()
	if err != nil {
		return fmt.Errorf("removing orphaned LV %s: %w", o.ID(), err)
	}
	a.decider.Reset(o.ID())
	log.Info("Removed orphaned volume", "lv", o.ID(), "size", o.Size, "deviceClass", o.Class, "claim", o.Claim, "volume", o.VolumeName)
	a.cfg.Events.Eventf(a.nodeRef(), corev1.EventTypeNormal, ReasonOrphanRemoved,
		"removed orphaned LV %s (%d bytes, device class %s, claim %s, volume %s): no PersistentVolume since %s (--remove-orphans)",
		o.ID(), o.Size, o.Class, o.Claim, o.VolumeName, o.Since.UTC().Format(time.RFC3339))
	return nil
}

// cut splits "a/b".
func cut(s string) (string, string, bool) {
	a, b, ok := strings.Cut(s, "/")
	return a, b, ok && a != "" && b != ""
}
