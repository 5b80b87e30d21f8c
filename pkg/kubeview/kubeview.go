// Package kubeview answers operators' questions about carve from the
// Kubernetes API alone (no node access, no metrics): the capacity each node
// reports per device class, which PVC, pod, node and LV each volume is, and
// which PVCs of carve's StorageClasses are Pending and why, and what the
// node audit found (orphaned LVs, volumes whose data is gone). kubectl-carve
// prints what it returns.
package kubeview

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/pkg/volume"
	"github.com/carve-csi/carve/topology"
	"github.com/carve-csi/carve/topology/pinned"
)

// deviceClassParam is the StorageClass parameter and volume context key
// that names a volume's device class (empty: the node's default class).
const deviceClassParam = "carve.dev/device-class"

// selectedNodeAnnotation is where the scheduler writes the node it picked
// for a WaitForFirstConsumer claim.
const selectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// Capacity is one CSIStorageCapacity object carve published: what a node
// reports for one StorageClass (one device class), and carve's volumes of
// that class on the node.
type Capacity struct {
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

// View reads the API for the driver named Driver.
type View struct {
	Client kubernetes.Interface
	Driver string
}

// storageClasses returns carve's StorageClasses by name, each with its
// device class.
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

// podsByClaim maps namespace/claim to the pods that use it.
func (v View) podsByClaim(ctx context.Context) (map[string][]string, error) {
	pods, err := v.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
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

// Volumes lists carve's PersistentVolumes, sorted by node and name.
func (v View) Volumes(ctx context.Context) ([]Volume, error) {
	pvs, err := v.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumes: %w", err)
	}
	pods, err := v.podsByClaim(ctx)
	if err != nil {
		return nil, err
	}
	var out []Volume
	for _, pv := range pvs.Items {
		csi := pv.Spec.CSI
		if csi == nil || csi.Driver != v.Driver {
			continue
		}
		vol := Volume{PV: pv.Name, Node: pinned.Node(&pv, topology.Key), DeviceClass: csi.VolumeAttributes[deviceClassParam],
			Phase: string(pv.Status.Phase)}
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
			vol.Pods = pods[vol.Claim]
		}
		out = append(out, vol)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].PV < out[j].PV
	})
	return out, nil
}

// Capacities lists the capacity carve published per node and StorageClass,
// with the volumes of that class on the node, sorted by node and class.
func (v View) Capacities(ctx context.Context) ([]Capacity, error) {
	classes, err := v.storageClasses(ctx)
	if err != nil {
		return nil, err
	}
	caps, err := v.Client.StorageV1().CSIStorageCapacities("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing CSIStorageCapacities: %w", err)
	}
	vols, err := v.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	var out []Capacity
	for _, c := range caps.Items {
		dc, ok := classes[c.StorageClassName]
		if !ok {
			continue
		}
		row := Capacity{Node: capacityNode(&c), StorageClass: c.StorageClassName, DeviceClass: dc}
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
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].StorageClass < out[j].StorageClass
	})
	return out, nil
}

// capacityNode is the node a CSIStorageCapacity object describes.
func capacityNode(c *storagev1.CSIStorageCapacity) string {
	if c.NodeTopology == nil {
		return ""
	}
	return c.NodeTopology.MatchLabels[topology.Key]
}

// eventTime is when an event last happened.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}

// PendingClaims lists the unbound PVCs of carve's StorageClasses with their
// last event, oldest first.
func (v View) PendingClaims(ctx context.Context) ([]Pending, error) {
	classes, err := v.storageClasses(ctx)
	if err != nil {
		return nil, err
	}
	pvcs, err := v.Client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PersistentVolumeClaims: %w", err)
	}
	pods, err := v.podsByClaim(ctx)
	if err != nil {
		return nil, err
	}
	var out []Pending
	for _, pvc := range pvcs.Items {
		sc := ""
		if pvc.Spec.StorageClassName != nil {
			sc = *pvc.Spec.StorageClassName
		}
		if _, ok := classes[sc]; !ok || pvc.Status.Phase != corev1.ClaimPending {
			continue
		}
		key := pvc.Namespace + "/" + pvc.Name
		p := Pending{Claim: key, StorageClass: sc, SelectedNode: pvc.Annotations[selectedNodeAnnotation],
			Pods: pods[key], Since: pvc.CreationTimestamp.Time}
		events, err := v.Client.CoreV1().Events(pvc.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=" + pvc.Name,
		})
		if err != nil {
			return nil, fmt.Errorf("listing the events of %s: %w", key, err)
		}
		var own []corev1.Event
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "PersistentVolumeClaim" && e.InvolvedObject.Name == pvc.Name {
				own = append(own, e)
			}
		}
		if last := lastEvent(own); last != nil {
			p.Reason, p.Message = last.Reason, last.Message
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Since.Before(out[j].Since) })
	return out, nil
}

// lastEvent is the most recent of events (by last, then first, timestamp).
func lastEvent(events []corev1.Event) *corev1.Event {
	var last *corev1.Event
	for i := range events {
		if last == nil || !eventTime(&events[i]).Before(eventTime(last)) {
			last = &events[i]
		}
	}
	return last
}

// Event reasons carve's node audit records (pkg/reconcile): an LV no PV points
// at, and a PV whose LV is gone.
const (
	reasonOrphan  = "OrphanedVolume"
	reasonMissing = "VolumeDataMissing"
)

// Finding is one thing carve's node audit reported as a Warning event: an
// orphaned LV (on a Node) or a volume whose data is missing (on a PV; the
// copy on its PVC is left out).
type Finding struct {
	Kind     string    `json:"kind"` // OrphanedVolume or VolumeDataMissing
	Object   string    `json:"object"`
	Message  string    `json:"message"`
	Count    int32     `json:"count"`
	LastSeen time.Time `json:"lastSeen"`
}

// Findings lists the audit's events still held by the API (events expire,
// one hour by default), newest first.
func (v View) Findings(ctx context.Context) ([]Finding, error) {
	var out []Finding
	for _, reason := range []string{reasonOrphan, reasonMissing} {
		events, err := v.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
		if err != nil {
			return nil, fmt.Errorf("listing %s events: %w", reason, err)
		}
		for i := range events.Items {
			e := &events.Items[i]
			kind := e.InvolvedObject.Kind
			if e.Reason != reason || (kind != "Node" && kind != "PersistentVolume") {
				continue
			}
			out = append(out, Finding{Kind: reason, Object: strings.ToLower(kind) + "/" + e.InvolvedObject.Name,
				Message: e.Message, Count: e.Count, LastSeen: eventTime(e)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastSeen.After(out[j].LastSeen) })
	return out, nil
}
