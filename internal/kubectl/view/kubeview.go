// Package view answers operators' questions about carve from the Kubernetes API alone;
// kubectl-carve prints its answers.
package view

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/topology/pinned"
	"github.com/carve-csi/carve/internal/volume"
)

// deviceClassParam names a volume's device class ("" is the node default).
const deviceClassParam = "carve.dev/device-class"

const selectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// The PV controller names a waited-for claim's provisioner here (beta key on old clusters).
const (
	provisionerAnnotation     = "volume.kubernetes.io/storage-provisioner"
	betaProvisionerAnnotation = "volume.beta.kubernetes.io/storage-provisioner"
)

// Capacity is one published CSIStorageCapacity with carve's volumes of its class there.
type Capacity struct {
	// Name is the object's name in carve's namespace.
	Name              string `json:"name"`
	Node              string `json:"node"`
	DeviceClass       string `json:"deviceClass"`
	StorageClass      string `json:"storageClass"`
	CapacityBytes     int64  `json:"capacityBytes"`
	MaximumVolumeSize int64  `json:"maximumVolumeSizeBytes,omitempty"`
	Volumes           int    `json:"volumes"`
	ProvisionedBytes  int64  `json:"provisionedBytes"`
}

// Volume is one PersistentVolume of carve's driver.
type Volume struct {
	PV          string   `json:"pv"`
	Claim       string   `json:"claim,omitempty"` // namespace/name
	Pods        []string `json:"pods,omitempty"`  // namespace/name of pods using the claim
	Node        string   `json:"node"`
	DeviceClass string   `json:"deviceClass"`
	VolumeGroup string   `json:"volumeGroup"`
	LV          string   `json:"lv"`
	SizeBytes   int64    `json:"sizeBytes"`
	Phase       string   `json:"phase"`
	// StorageClass and Created are the PV's (the claim's without PV rights).
	StorageClass string    `json:"storageClass,omitempty"`
	Created      time.Time `json:"created,omitzero"`
}

// Pending is a PVC of one of carve's StorageClasses that is not bound.
type Pending struct {
	Claim        string    `json:"claim"` // namespace/name
	StorageClass string    `json:"storageClass"`
	SelectedNode string    `json:"selectedNode,omitempty"`
	Pods         []string  `json:"pods,omitempty"`
	Since        time.Time `json:"since"`
	// Reason and Message are the claim's last event (empty when none).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// View reads the API for Driver, one List per kind joined in memory.
type View struct {
	Client kubernetes.Interface
	// Dynamic reads VolumeSnapshots; only Snapshots needs it.
	Dynamic dynamic.Interface
	Driver  string
	// AgentService is the agents' headless Service; "" is carve-node.
	AgentService string
	// Namespace limits namespaced views to one namespace; "" is all.
	Namespace string
	// Warn, when set, hears what a view left out (a kind the user may not list).
	Warn func(msg string)
}

// namespacedRights tells a cluster-wide list refused to a namespaced user.
func (v View) namespacedRights(err error) bool {
	return v.Namespace != "" && apierrors.IsForbidden(err)
}

func (v View) warn(msg string) {
	if v.Warn != nil {
		v.Warn(msg)
	}
}

// storageClasses returns carve's StorageClasses with their device class.
func (v View) storageClasses(ctx context.Context) (map[string]string, error) {
	list, err := v.Client.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing StorageClasses: %w", err)
	}
	out := map[string]string{}
	for _, sc := range list.Items {
		if sc.Provisioner == v.Driver {
			out[sc.Name] = sc.Parameters[deviceClassParam]
		}
	}
	return out, nil
}

func (v View) podsByClaim(ctx context.Context) (map[string][]string, error) {
	pods, err := v.Client.CoreV1().Pods(v.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	out := map[string][]string{}
	for _, p := range pods.Items {
		for _, vol := range p.Spec.Volumes {
			if c := vol.PersistentVolumeClaim; c != nil {
				k := p.Namespace + "/" + c.ClaimName
				out[k] = append(out[k], p.Namespace+"/"+p.Name)
			}
		}
	}
	return out, nil
}

// Volumes lists carve's PVs by node and name; without rights to list PVs, the
// namespace's carve claims.
func (v View) Volumes(ctx context.Context) ([]Volume, error) {
	pvs, err := v.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil && !v.namespacedRights(err) {
		return nil, fmt.Errorf("listing PersistentVolumes: %w", err)
	}
	forbidden := err != nil
	pods, err := v.podsByClaim(ctx)
	if err != nil {
		return nil, err
	}
	var out []Volume
	if forbidden {
		v.warn("may not list PersistentVolumes: volume group and LV are left out")
		if out, err = v.claimVolumes(ctx); err != nil {
			return nil, err
		}
	} else {
		for _, vol := range v.pvVolumes(pvs.Items) {
			if v.Namespace == "" || strings.HasPrefix(vol.Claim, v.Namespace+"/") {
				out = append(out, vol)
			}
		}
	}
	for i := range out {
		out[i].Pods = pods[out[i].Claim]
	}
	sortBy(out, func(r Volume) string { return r.Node }, func(r Volume) string { return r.PV })
	return out, nil
}

func (v View) pvVolumes(pvs []corev1.PersistentVolume) []Volume {
	var out []Volume
	for i := range pvs {
		if vol, ok := v.pvVolume(&pvs[i]); ok {
			out = append(out, vol)
		}
	}
	return out
}

func (v View) pvVolume(pv *corev1.PersistentVolume) (Volume, bool) {
	csi := pv.Spec.CSI
	if csi == nil || csi.Driver != v.Driver {
		return Volume{}, false
	}
	vol := Volume{PV: pv.Name, Node: pinned.Node(pv, topology.Key), DeviceClass: csi.VolumeAttributes[deviceClassParam],
		StorageClass: pv.Spec.StorageClassName, Phase: string(pv.Status.Phase), Created: pv.CreationTimestamp.Time}
	if vg, lv, err := volume.ParseVolumeID(csi.VolumeHandle); err == nil {
		vol.VolumeGroup, vol.LV = vg, lv
	} else {
		vol.LV = csi.VolumeHandle // not carve's form: show it as it is
	}
	if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		vol.SizeBytes = q.Value()
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		vol.Claim = ref.Namespace + "/" + ref.Name
	}
	return vol, true
}

// claimVolumes are the namespace's bound carve claims, per their annotations.
func (v View) claimVolumes(ctx context.Context) ([]Volume, error) {
	pvcs, err := v.Client.CoreV1().PersistentVolumeClaims(v.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumeClaims: %w", err)
	}
	var out []Volume
	for i := range pvcs.Items {
		c := &pvcs.Items[i]
		if !v.provisionedBy(c) || c.Spec.VolumeName == "" {
			continue
		}
		vol := Volume{PV: c.Spec.VolumeName, Claim: c.Namespace + "/" + c.Name, Node: c.Annotations[selectedNodeAnnotation],
			Phase: string(corev1.VolumeBound), Created: c.CreationTimestamp.Time}
		if c.Spec.StorageClassName != nil {
			vol.StorageClass = *c.Spec.StorageClassName
		}
		if q, ok := c.Status.Capacity[corev1.ResourceStorage]; ok {
			vol.SizeBytes = q.Value()
		}
		out = append(out, vol)
	}
	return out, nil
}

func (v View) provisionedBy(c *corev1.PersistentVolumeClaim) bool {
	return c.Annotations[provisionerAnnotation] == v.Driver || c.Annotations[betaProvisionerAnnotation] == v.Driver
}

// Capacities lists carve's capacity per node and class with its volumes, sorted.
func (v View) Capacities(ctx context.Context) ([]Capacity, error) { return v.capacities(ctx, true) }

func (v View) capacities(ctx context.Context, withVolumes bool) ([]Capacity, error) {
	classes, err := v.storageClasses(ctx)
	if err != nil {
		return nil, err
	}
	caps, err := v.Client.StorageV1().CSIStorageCapacities("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing CSIStorageCapacities: %w", err)
	}
	// Every node's volumes, whatever their claims' namespace.
	var vols []Volume
	if withVolumes {
		pvs, err := v.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing PersistentVolumes: %w", err)
		}
		vols = v.pvVolumes(pvs.Items)
	}
	var out []Capacity
	for _, c := range caps.Items {
		dc, ok := classes[c.StorageClassName]
		if !ok {
			continue
		}
		row := Capacity{Name: c.Name, Node: capacityNode(&c), StorageClass: c.StorageClassName, DeviceClass: dc}
		if c.Capacity != nil {
			row.CapacityBytes = c.Capacity.Value()
		}
		if c.MaximumVolumeSize != nil {
			row.MaximumVolumeSize = c.MaximumVolumeSize.Value()
		}
		for _, vol := range vols {
			if vol.Node == row.Node && vol.DeviceClass == dc {
				row.Volumes++
				row.ProvisionedBytes += vol.SizeBytes
			}
		}
		out = append(out, row)
	}
	sortBy(out, func(r Capacity) string { return r.Node }, func(r Capacity) string { return r.StorageClass })
	return out, nil
}

func capacityNode(c *storagev1.CSIStorageCapacity) string {
	if c.NodeTopology == nil {
		return ""
	}
	return c.NodeTopology.MatchLabels[topology.Key]
}

func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}

// PendingClaims lists unbound carve claims with their last event, oldest first.
func (v View) PendingClaims(ctx context.Context) ([]Pending, error) {
	// Without rights to StorageClasses, the provisioner annotation tells carve's claims.
	classes, err := v.storageClasses(ctx)
	if err != nil && !v.namespacedRights(err) {
		return nil, err
	}
	pvcs, err := v.Client.CoreV1().PersistentVolumeClaims(v.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumeClaims: %w", err)
	}
	pods, err := v.podsByClaim(ctx)
	if err != nil {
		return nil, err
	}
	// One list of every claim's events, not one per claim.
	events, err := v.Client.CoreV1().Events(v.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=PersistentVolumeClaim",
	})
	if err != nil {
		return nil, fmt.Errorf("listing the events of PersistentVolumeClaims: %w", err)
	}
	byClaim := map[string][]corev1.Event{}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "PersistentVolumeClaim" {
			k := e.Namespace + "/" + e.InvolvedObject.Name
			byClaim[k] = append(byClaim[k], e)
		}
	}
	var out []Pending
	for _, pvc := range pvcs.Items {
		sc := ""
		if pvc.Spec.StorageClassName != nil {
			sc = *pvc.Spec.StorageClassName
		}
		_, ours := classes[sc]
		if classes == nil {
			ours = v.provisionedBy(&pvc)
		}
		if !ours || pvc.Status.Phase != corev1.ClaimPending {
			continue
		}
		key := pvc.Namespace + "/" + pvc.Name
		p := Pending{Claim: key, StorageClass: sc, SelectedNode: pvc.Annotations[selectedNodeAnnotation],
			Pods: pods[key], Since: pvc.CreationTimestamp.Time}
		if last := lastEvent(byClaim[key]); last != nil {
			p.Reason, p.Message = last.Reason, last.Message
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out, nil
}

// lastEvent is the newest of events (by last, then first, timestamp).
func lastEvent(events []corev1.Event) *corev1.Event {
	var last *corev1.Event
	for i := range events {
		if last == nil || !eventTime(&events[i]).Before(eventTime(last)) {
			last = &events[i]
		}
	}
	return last
}

// Event reasons of the controller's audit (on Nodes, and VolumeDataMissing on PVs).
const (
	reasonOrphan      = "OrphanedVolume"
	reasonQuarantined = "OrphanedVolumeQuarantined"
	reasonRemoved     = "OrphanedVolumeRemoved"
	reasonClaimed     = "QuarantinedVolumeClaimed"
	reasonMissing     = "VolumeDataMissing"
)

// auditComponent is the source of the audit's Events.
const auditComponent = "carve-controller"

// Finding is one audit Event.
type Finding struct {
	// Kind is the event's reason.
	Kind     string    `json:"kind"`
	Object   string    `json:"object"`
	Message  string    `json:"message"`
	Count    int32     `json:"count"`
	LastSeen time.Time `json:"lastSeen"`
}

// Findings lists the audit's events the API still holds, newest first.
func (v View) Findings(ctx context.Context) ([]Finding, error) {
	var out []Finding
	for _, q := range []struct {
		selector string
		kind     string
		reasons  []string
	}{
		{"involvedObject.kind=Node,source=" + auditComponent, "Node", []string{reasonOrphan, reasonQuarantined, reasonRemoved, reasonClaimed}},
		{"reason=" + reasonMissing, "PersistentVolume", []string{reasonMissing}},
	} {
		events, err := v.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: q.selector})
		if err != nil {
			return nil, fmt.Errorf("listing the audit's events (%s): %w", q.selector, err)
		}
		for i := range events.Items {
			e := &events.Items[i]
			if !slices.Contains(q.reasons, e.Reason) || e.InvolvedObject.Kind != q.kind {
				continue
			}
			out = append(out, Finding{Kind: e.Reason, Object: strings.ToLower(e.InvolvedObject.Kind) + "/" + e.InvolvedObject.Name,
				Message: e.Message, Count: e.Count, LastSeen: eventTime(e)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastSeen.After(out[j].LastSeen) })
	return out, nil
}

// sortBy sorts rows by first, then by second.
func sortBy[T any](rows []T, first, second func(T) string) {
	slices.SortFunc(rows, func(a, b T) int {
		return cmp.Or(strings.Compare(first(a), first(b)), strings.Compare(second(a), second(b)))
	})
}
