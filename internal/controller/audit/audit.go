package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
	carvemetrics "github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/topology/pinned"
)

// Event reasons.
const (
	ReasonOrphan            = "OrphanedVolume"
	ReasonOrphanQuarantined = "OrphanedVolumeQuarantined"
	ReasonOrphanRemoved     = "OrphanedVolumeRemoved"
	ReasonQuarantineClaimed = "QuarantinedVolumeClaimed"
	ReasonMissing           = "VolumeDataMissing"
)

const askAtOnce = 16

// Nodes are the node agents, reached over the node channel.
type Nodes interface {
	// Names lists the connected nodes.
	Names() []string
	// Inventory reads a node's LVM side from its agent.
	Inventory(ctx context.Context, node string) (*Inventory, error)
	// QuarantineOrphan deactivates and renames an orphan LV (carve-orphan-<hex>,
	// tagged with its name and at) under the node's volume locks and returns
	// its new name ("" when gone). It refuses an LV busy, not carve's, without
	// claim tag, with snapshots or open.
	QuarantineOrphan(ctx context.Context, node, vg, name string, at time.Time) (string, error)
	// RemoveOrphan removes a quarantined orphan (once named orphanOf) under the
	// node's volume lock; nil when gone. It refuses one busy, not carve's, not
	// that quarantine, or with snapshots.
	RemoveOrphan(ctx context.Context, node, vg, name, orphanOf string) error
	// VolumeHealth reads the node's volumes with a health problem.
	VolumeHealth(ctx context.Context, node string) ([]VolumeHealth, error)
	// InvalidSnapshots lists the node's snapshots not ready to use.
	InvalidSnapshots(ctx context.Context, node string) ([]string, error)
}

// Inventory is one node's LVM side, as its agent reported it.
type Inventory struct {
	// LVs are carve's LVs (owner tag) in the node's configured volume groups.
	LVs []LV
	// Classes are the node's device classes.
	Classes []Class
	// Unreadable are the volume groups the node could not read: their LVs are
	// unknown, not absent.
	Unreadable []string
	// Busy are the LV names with a CreateVolume or DeleteVolume in flight.
	Busy []string
}

func (inv *Inventory) readable(vg string) bool {
	return slices.ContainsFunc(inv.Classes, func(c Class) bool { return c.VolumeGroup == vg }) && !slices.Contains(inv.Unreadable, vg)
}

func (inv *Inventory) busy(name string) bool { return slices.Contains(inv.Busy, name) }

// Config is what the audit needs.
type Config struct {
	// Driver is carve's CSI driver name; TopologyKey its node-affinity key.
	Driver, TopologyKey string
	Client              kubernetes.Interface
	// PVs is the cache of carve's PVs.
	PVs PVs
	// Nodes reaches the node agents.
	Nodes Nodes
	// Grace is how long an LV must lack a PV (or a PV its LV) before it is
	// reported; Interval how often the audit runs.
	Grace, Interval time.Duration
	// RemovalGrace is how long an orphan stays quarantined before removal.
	RemovalGrace time.Duration
	// RemoveOrphans quarantines reported orphans and removes them after
	// RemovalGrace; false only reports.
	RemoveOrphans bool
	// Registerer takes the audit's metrics.
	Registerer prometheus.Registerer
	// Events records the Events.
	Events record.EventRecorder
	// Contents finds an invalid snapshot's content; nil leaves snapshots alone.
	Contents SnapshotContents
}

// Auditor runs the audit loop over every connected node.
type Auditor struct {
	cfg Config
	m   *metrics
	// nodes is touched only by Pass, each entry only by its node's audit.
	nodes map[string]*nodeAudit
}

// nodeAudit is one node's audit state while its agent stays connected: a
// reconnect restarts every clock, so findings come late, never early.
type nodeAudit struct {
	node    string
	decider *Decider
	// reported makes each finding announced once per connection and leadership.
	reported map[string]bool
	// abnormal are the PVs announced abnormal until they recover or go.
	abnormal map[string]abnormal
	invalid  map[string]bool
}

// New returns an Auditor with its metrics registered.
func New(cfg Config) *Auditor {
	return &Auditor{cfg: cfg, m: newMetrics(cfg.Registerer), nodes: map[string]*nodeAudit{}}
}

// PVs is the cache of carve's PersistentVolumes.
type PVs interface {
	// WaitForSync waits for the first full list; false when ctx ended first.
	WaitForSync(ctx context.Context) bool
	// List returns carve's PVs of every node.
	List() []*corev1.PersistentVolume
}

// Run audits every Interval until ctx ends. Nothing runs before the PV
// cache is synced, so a cold cache never makes an orphan.
func (a *Auditor) Run(ctx context.Context) error {
	log := klog.FromContext(ctx).WithName("audit")
	ctx = klog.NewContext(ctx, log)
	if !a.cfg.PVs.WaitForSync(ctx) {
		return nil // ctx ended
	}
	log.Info("Auditing the nodes' carve LVs against the PersistentVolumes", "gracePeriod", a.cfg.Grace, "interval", a.cfg.Interval,
		"removeOrphans", a.cfg.RemoveOrphans, "removalGracePeriod", a.cfg.RemovalGrace)
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

// PVFrom is the decision's view of a carve PersistentVolume.
func PVFrom(pv *corev1.PersistentVolume, topologyKey string) PV {
	p := PV{Name: pv.Name, Node: pinned.Node(pv, topologyKey),
		Going: pv.DeletionTimestamp != nil ||
			pv.Status.Phase == corev1.VolumeReleased && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete}
	if pv.Spec.CSI != nil {
		p.Handle = pv.Spec.CSI.VolumeHandle
	}
	if r := pv.Spec.ClaimRef; r != nil {
		p.Claim, p.ClaimUID = r.Namespace+"/"+r.Name, string(r.UID)
	}
	p.MoveTarget, p.MoveTargetHandle = moveapi.Targets(pv.Annotations)
	return p
}

// Pass audits every connected node over pvs (carve's PVs of every node).
func (a *Auditor) Pass(ctx context.Context, now time.Time, pvs []PV) {
	names := a.cfg.Nodes.Names()
	for n := range a.nodes {
		if !slices.Contains(names, n) {
			delete(a.nodes, n)
			a.m.forget(n)
		}
	}
	var wg sync.WaitGroup
	slots := make(chan struct{}, askAtOnce)
	for _, n := range names {
		na := a.nodes[n]
		if na == nil {
			na = &nodeAudit{node: n, decider: NewDecider(a.cfg.Grace, a.cfg.RemovalGrace), reported: map[string]bool{}, invalid: map[string]bool{}}
			a.nodes[n] = na
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			a.passNode(ctx, now, na, pvs)
		})
	}
	wg.Wait()
}

func (a *Auditor) passNode(ctx context.Context, now time.Time, na *nodeAudit, pvs []PV) {
	log := klog.FromContext(ctx).WithValues("node", na.node)
	ctx = klog.NewContext(ctx, log)
	inv, err := a.cfg.Nodes.Inventory(ctx, na.node)
	if err != nil {
		// Nothing judged: the clocks run on and the gauges keep the last findings.
		err = fmt.Errorf("reading the inventory of node %s: %w", na.node, err)
		a.m.ran(na.node, now, err)
		log.Error(err, "Audit pass incomplete")
		return
	}
	f := na.decider.Decide(Input{Now: now, LVs: inv.LVs, PVs: pvs, Node: na.node,
		Readable: inv.readable, Busy: inv.busy})
	orphans, errs := a.unclaimed(ctx, log, na, f.Orphans)
	a.announce(log, na, orphans, f)
	quarantined := f.Quarantined
	if a.cfg.RemoveOrphans {
		var actErrs []error
		orphans, quarantined, actErrs = a.act(ctx, na, orphans, quarantined, now)
		errs = append(errs, actErrs...)
	}
	a.m.publish(na.node, inv.Classes, orphans, f.Missing, quarantined)
	na.forgetAnnounced(orphans, f.Missing, quarantined)
	errs = append(errs, a.judgeNode(ctx, log, na, inv, pvs, f.Missing)...)
	a.m.ran(na.node, now, errors.Join(errs...))
	if err := errors.Join(errs...); err != nil {
		log.Error(err, "Audit pass incomplete")
	}
}

// unclaimed is the orphans whose claim is gone. A live claim (the
// provisioner still wants it) restarts the clock; an unreadable one defers
// the report.
func (a *Auditor) unclaimed(ctx context.Context, log klog.Logger, na *nodeAudit, found []Orphan) ([]Orphan, []error) {
	var errs []error
	orphans := found[:0]
	for _, o := range found {
		alive, err := a.claimAlive(ctx, o.LV)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if alive {
			log.V(2).Info("LV without a PV, but its claim still exists; not an orphan", "lv", o.ID(), "claim", o.Claim)
			na.decider.Reset(o.ID())
			continue
		}
		orphans = append(orphans, o)
	}
	return orphans, errs
}

func (a *Auditor) announce(log klog.Logger, na *nodeAudit, orphans []Orphan, f Findings) {
	for _, o := range orphans {
		a.announceOrphan(log, na, o)
	}
	for _, x := range f.Missing {
		a.announceMissing(log, na, x)
	}
	for _, q := range f.Quarantined {
		if q.ClaimedBy != "" {
			a.announceClaimed(log, na, q)
		}
	}
}

// act quarantines orphans whose claim is known and removes quarantined ones
// past their grace, returning what is left. An orphan naming no claim is
// never touched; a failed step leaves the LV as it was.
func (a *Auditor) act(ctx context.Context, na *nodeAudit, orphans []Orphan, quarantined []Quarantined, now time.Time) ([]Orphan, []Quarantined, []error) {
	var errs []error
	var left []Orphan
	for _, o := range orphans {
		if o.Claim == "" {
			left = append(left, o)
			continue
		}
		q, err := a.quarantine(ctx, na, o, now)
		if err != nil {
			errs = append(errs, err)
			left = append(left, o)
			continue
		}
		if q != nil {
			quarantined = append(quarantined, *q)
		}
	}
	kept := quarantined[:0]
	for _, q := range quarantined {
		if !q.Removable {
			kept = append(kept, q)
			continue
		}
		if err := a.remove(ctx, na, q); err != nil {
			errs = append(errs, err)
			kept = append(kept, q)
		}
	}
	return left, kept, errs
}

func (a *Auditor) judgeNode(ctx context.Context, log klog.Logger, na *nodeAudit, inv *Inventory, pvs []PV, missing []Missing) []error {
	var errs []error
	if health, err := a.cfg.Nodes.VolumeHealth(ctx, na.node); err != nil {
		errs = append(errs, fmt.Errorf("reading the volume health of node %s: %w", na.node, err))
	} else {
		a.judgeHealth(log, na, inv, pvs, health, missing)
	}
	if a.cfg.Contents != nil {
		if err := a.judgeSnapshots(ctx, log, na); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// claimAlive tells whether the orphan's PVC still exists and is the one the
// volume was made for (the PV is "pvc-<claim UID>"); false with no claim tag.
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

func nodeRef(node string) *corev1.ObjectReference {
	// The kubelet's Events on a Node use its name as the UID.
	return &corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node), APIVersion: "v1"}
}

func (a *Auditor) announceOrphan(log klog.Logger, na *nodeAudit, o Orphan) {
	key := "orphan/" + o.ID()
	if na.reported[key] {
		return
	}
	na.reported[key] = true
	claim := o.Claim
	if claim == "" {
		claim = "unknown (no claim tag: carve never quarantines or removes it)"
	}
	log.Info("Orphaned volume: no PersistentVolume points at this LV", "lv", o.ID(), "size", o.Size,
		"deviceClass", o.Class, "claim", claim, "volume", o.VolumeName, "since", o.Since.UTC().Format(time.RFC3339))
	a.cfg.Events.Eventf(nodeRef(na.node), corev1.EventTypeWarning, ReasonOrphan,
		"LV %s (%d bytes, device class %s) has had no PersistentVolume since %s; it was made for claim %s (volume %s). See carve's operations runbook: orphaned volumes",
		o.ID(), o.Size, o.Class, o.Since.UTC().Format(time.RFC3339), claim, o.VolumeName)
}

func (a *Auditor) announceMissing(log klog.Logger, na *nodeAudit, x Missing) {
	key := "missing/" + x.Name
	if na.reported[key] {
		return
	}
	na.reported[key] = true
	log.Error(nil, "Volume data missing: the LV of this PersistentVolume is gone from the volume group", "pv", x.Name,
		"lv", x.Handle, "claim", x.Claim, "since", x.Since.UTC().Format(time.RFC3339))
	msg := fmt.Sprintf("the LV %s of PersistentVolume %s is gone from node %s's volume group since %s (disk replaced or volume group made anew?); its data is lost. See carve's operations runbook: missing data",
		x.Handle, x.Name, na.node, x.Since.UTC().Format(time.RFC3339))
	a.cfg.Events.Event(&corev1.ObjectReference{Kind: "PersistentVolume", Name: x.Name, APIVersion: "v1"},
		corev1.EventTypeWarning, ReasonMissing, msg)
	if ns, name, ok := cut(x.Claim); ok {
		a.cfg.Events.Event(&corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: name,
			UID: types.UID(x.ClaimUID), APIVersion: "v1"}, corev1.EventTypeWarning, ReasonMissing, msg)
	}
}

// announceClaimed warns once of a PV naming a quarantined orphan: it is
// kept until someone restores it.
func (a *Auditor) announceClaimed(log klog.Logger, na *nodeAudit, q Quarantined) {
	key := "claimed/" + q.ID()
	if na.reported[key] {
		return
	}
	na.reported[key] = true
	log.Info("A PersistentVolume names a quarantined orphan; it is kept until restored", "lv", q.ID(), "originalLV", q.OriginalID(),
		"pv", q.ClaimedBy, "quarantinedSince", q.Since.UTC().Format(time.RFC3339))
	msg := fmt.Sprintf("PersistentVolume %s names LV %s, which carve quarantined as orphan %s on node %s at %s; carve keeps it. "+
		"Restore it on the node: lvrename %s %s %s (carve's operations runbook: orphaned volumes)",
		q.ClaimedBy, q.OriginalID(), q.ID(), na.node, q.Since.UTC().Format(time.RFC3339), q.VolumeGroup, q.Name, q.OrphanOf)
	a.cfg.Events.Event(nodeRef(na.node), corev1.EventTypeWarning, ReasonQuarantineClaimed, msg)
	a.cfg.Events.Event(&corev1.ObjectReference{Kind: "PersistentVolume", Name: q.ClaimedBy, APIVersion: "v1"},
		corev1.EventTypeWarning, ReasonQuarantineClaimed, msg)
}

// forgetAnnounced drops what is gone, so it is announced again if it returns.
func (na *nodeAudit) forgetAnnounced(orphans []Orphan, missing []Missing, quarantined []Quarantined) {
	now := map[string]bool{}
	for _, o := range orphans {
		now["orphan/"+o.ID()] = true
	}
	for _, x := range missing {
		now["missing/"+x.Name] = true
	}
	for _, q := range quarantined {
		if q.ClaimedBy != "" {
			now["claimed/"+q.ID()] = true
		}
	}
	for k := range na.reported {
		if !now[k] {
			delete(na.reported, k)
		}
	}
}

// quarantine deactivates and renames an orphan (--remove-orphans only); nil
// when the LV was gone.
func (a *Auditor) quarantine(ctx context.Context, na *nodeAudit, o Orphan, now time.Time) (*Quarantined, error) {
	log := klog.FromContext(ctx)
	newName, err := a.cfg.Nodes.QuarantineOrphan(ctx, na.node, o.VolumeGroup, o.Name, now)
	a.m.quarantinedTotal.WithLabelValues(na.node, o.Class, o.VolumeGroup, carvemetrics.Result(err)).Inc()
	if err != nil {
		return nil, fmt.Errorf("quarantining orphaned LV %s: %w", o.ID(), err)
	}
	na.decider.Reset(o.ID())
	if newName == "" {
		return nil, nil
	}
	q := Quarantined{LV: o.LV, Since: now.Truncate(time.Second)}
	q.Name, q.OrphanOf, q.OrphanedAt = newName, o.Name, q.Since
	log.Info("Quarantined orphaned volume: deactivated and renamed, data kept", "lv", o.ID(), "as", q.ID(), "size", o.Size,
		"deviceClass", o.Class, "claim", o.Claim, "volume", o.VolumeName, "removalAfter", a.cfg.RemovalGrace)
	a.cfg.Events.Eventf(nodeRef(na.node), corev1.EventTypeNormal, ReasonOrphanQuarantined,
		"quarantined orphaned LV %s as %s (%d bytes, device class %s, claim %s, volume %s; no PersistentVolume since %s): deactivated, data kept; "+
			"removed after %s unless a PersistentVolume names it (--remove-orphans). Restore: lvrename %s %s %s",
		o.ID(), q.ID(), o.Size, o.Class, o.Claim, o.VolumeName, o.Since.UTC().Format(time.RFC3339), a.cfg.RemovalGrace,
		o.VolumeGroup, newName, o.Name)
	return &q, nil
}

func (a *Auditor) remove(ctx context.Context, na *nodeAudit, q Quarantined) error {
	log := klog.FromContext(ctx)
	err := a.cfg.Nodes.RemoveOrphan(ctx, na.node, q.VolumeGroup, q.Name, q.OrphanOf)
	a.m.removed.WithLabelValues(na.node, q.Class, q.VolumeGroup, carvemetrics.Result(err)).Inc()
	if err != nil {
		return fmt.Errorf("removing quarantined orphan %s: %w", q.ID(), err)
	}
	log.Info("Removed quarantined orphan", "lv", q.ID(), "originalLV", q.OriginalID(), "size", q.Size, "deviceClass", q.Class,
		"claim", q.Claim, "volume", q.VolumeName, "quarantinedSince", q.Since.UTC().Format(time.RFC3339))
	a.cfg.Events.Eventf(nodeRef(na.node), corev1.EventTypeNormal, ReasonOrphanRemoved,
		"removed orphaned LV %s (LV %s before its quarantine at %s; %d bytes, device class %s, claim %s, volume %s): "+
			"quarantined for %s with no PersistentVolume naming it (--remove-orphans)",
		q.ID(), q.OriginalID(), q.Since.UTC().Format(time.RFC3339), q.Size, q.Class, q.Claim, q.VolumeName, a.cfg.RemovalGrace)
	return nil
}

func cut(s string) (string, string, bool) {
	a, b, ok := strings.Cut(s, "/")
	return a, b, ok && a != "" && b != ""
}
