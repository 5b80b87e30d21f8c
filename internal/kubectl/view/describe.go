package view

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/volume"
)

// Claim is everything the API knows about one carve claim.
type Claim struct {
	Namespace    string            `json:"namespace"`
	Name         string            `json:"name"`
	Phase        string            `json:"phase"`
	StorageClass string            `json:"storageClass,omitempty"`
	DeviceClass  string            `json:"deviceClass,omitempty"`
	Requested    int64             `json:"requestedBytes,omitempty"`
	SizeBytes    int64             `json:"sizeBytes,omitempty"`
	AccessModes  []string          `json:"accessModes,omitempty"`
	VolumeMode   string            `json:"volumeMode,omitempty"`
	SelectedNode string            `json:"selectedNode,omitempty"`
	Pods         []string          `json:"pods,omitempty"`
	Created      time.Time         `json:"created,omitzero"`
	PV           string            `json:"pv,omitempty"`
	PVPhase      string            `json:"pvPhase,omitempty"`
	Reclaim      string            `json:"reclaimPolicy,omitempty"`
	Node         string            `json:"node,omitempty"`
	VolumeHandle string            `json:"volumeHandle,omitempty"`
	VolumeGroup  string            `json:"volumeGroup,omitempty"`
	LV           string            `json:"lv,omitempty"`
	FSType       string            `json:"fsType,omitempty"`
	Attributes   map[string]string `json:"volumeAttributes,omitempty"`
	// AttributesClass is the current VolumeAttributesClass; Modify csi-resizer's report.
	AttributesClass string `json:"volumeAttributesClass,omitempty"`
	Modify          string `json:"modifyVolumeStatus,omitempty"`
	// IOLimits are the StorageClass's limits with the VolumeAttributesClass's over them.
	IOLimits map[string]string `json:"ioLimits,omitempty"`
	// Encryption is "luks2" or "none" (PV, else StorageClass); KeyID is the PV's.
	Encryption string  `json:"encryption,omitempty"`
	KeyID      string  `json:"encryptionKeyID,omitempty"`
	Events     []Event `json:"events,omitempty"`
	// Metrics are PromQL selectors of the series that watch this volume.
	Metrics []string `json:"metrics,omitempty"`
}

// Event is one event of the claim or its PV.
type Event struct {
	Object   string    `json:"object"` // kind/name
	Type     string    `json:"type"`
	Reason   string    `json:"reason"`
	From     string    `json:"from,omitempty"`
	Message  string    `json:"message"`
	Count    int32     `json:"count,omitempty"`
	LastSeen time.Time `json:"lastSeen"`
}

// Describe gathers claim name of Namespace; what the user may not read is warned about.
func (v View) Describe(ctx context.Context, name string) (*Claim, error) {
	pvc, err := v.Client.CoreV1().PersistentVolumeClaims(v.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", v.Namespace, name, err)
	}
	c := claimOf(pvc)
	if err := v.addClassAndVolume(ctx, c); err != nil {
		return nil, err
	}
	if c.Node == "" {
		c.Node = c.SelectedNode
	}

	pods, err := v.podsByClaim(ctx)
	if err != nil {
		return nil, err
	}
	c.Pods = pods[c.Namespace+"/"+c.Name]

	events, err := v.Client.CoreV1().Events(c.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=" + c.Name})
	if err != nil {
		return nil, fmt.Errorf("listing the events of %s/%s: %w", c.Namespace, c.Name, err)
	}
	c.addEvents(events.Items, "PersistentVolumeClaim", c.Name)
	if c.PV != "" {
		// A cluster-scoped object's events are in the default namespace.
		events, err := v.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=PersistentVolume,involvedObject.name=" + c.PV})
		switch {
		case err == nil:
			c.addEvents(events.Items, "PersistentVolume", c.PV)
		case apierrors.IsForbidden(err):
			v.warn(fmt.Sprintf("the events of PersistentVolume %s: %v", c.PV, err))
		default:
			return nil, fmt.Errorf("listing the events of PersistentVolume %s: %w", c.PV, err)
		}
	}
	sort.SliceStable(c.Events, func(i, j int) bool { return c.Events[i].LastSeen.Before(c.Events[j].LastSeen) })
	c.Metrics = c.metrics()
	return c, nil
}

func claimOf(pvc *corev1.PersistentVolumeClaim) *Claim {
	c := &Claim{Namespace: pvc.Namespace, Name: pvc.Name, Phase: string(pvc.Status.Phase), PV: pvc.Spec.VolumeName,
		SelectedNode: pvc.Annotations[selectedNodeAnnotation], Created: pvc.CreationTimestamp.Time}
	if pvc.Spec.StorageClassName != nil {
		c.StorageClass = *pvc.Spec.StorageClassName
	}
	if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		c.Requested = q.Value()
	}
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		c.SizeBytes = q.Value()
	}
	for _, m := range pvc.Spec.AccessModes {
		c.AccessModes = append(c.AccessModes, string(m))
	}
	if pvc.Spec.VolumeMode != nil {
		c.VolumeMode = string(*pvc.Spec.VolumeMode)
	}
	if cur := pvc.Status.CurrentVolumeAttributesClassName; cur != nil {
		c.AttributesClass = *cur
	}
	if m := pvc.Status.ModifyVolumeStatus; m != nil {
		c.Modify = fmt.Sprintf("%s to %s", m.Status, m.TargetVolumeAttributesClassName)
	}
	return c
}

func (v View) addIOLimits(ctx context.Context, c *Claim, params map[string]string) error {
	set := func(p map[string]string) {
		for k, val := range p {
			if volume.IsIOLimitParam(k) {
				if c.IOLimits == nil {
					c.IOLimits = map[string]string{}
				}
				c.IOLimits[k] = val
			}
		}
	}
	set(params)
	if c.AttributesClass == "" {
		return nil
	}
	vac, err := v.Client.StorageV1().VolumeAttributesClasses().Get(ctx, c.AttributesClass, metav1.GetOptions{})
	switch {
	case err == nil:
		set(vac.Parameters)
	case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
		v.warn(fmt.Sprintf("VolumeAttributesClass %s: %v", c.AttributesClass, err))
	default:
		return fmt.Errorf("reading VolumeAttributesClass %s: %w", c.AttributesClass, err)
	}
	return nil
}

// addClassAndVolume adds the device class, node, volume group and LV.
func (v View) addClassAndVolume(ctx context.Context, c *Claim) error {
	var scParams map[string]string
	if c.StorageClass != "" {
		sc, err := v.Client.StorageV1().StorageClasses().Get(ctx, c.StorageClass, metav1.GetOptions{})
		switch {
		case err == nil:
			if sc.Provisioner != v.Driver {
				v.warn(fmt.Sprintf("StorageClass %s is %s's, not %s's", sc.Name, sc.Provisioner, v.Driver))
			}
			c.DeviceClass = sc.Parameters[deviceClassParam]
			scParams = sc.Parameters
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
			v.warn(fmt.Sprintf("StorageClass %s: %v", c.StorageClass, err))
		default:
			return fmt.Errorf("reading StorageClass %s: %w", c.StorageClass, err)
		}
	}
	if c.PV != "" {
		pv, err := v.Client.CoreV1().PersistentVolumes().Get(ctx, c.PV, metav1.GetOptions{})
		switch {
		case err == nil:
			if vol, ok := v.pvVolume(pv); ok {
				c.Node, c.VolumeGroup, c.LV, c.DeviceClass = vol.Node, vol.VolumeGroup, vol.LV, vol.DeviceClass
				c.VolumeHandle, c.FSType, c.Attributes = pv.Spec.CSI.VolumeHandle, pv.Spec.CSI.FSType, pv.Spec.CSI.VolumeAttributes
			} else {
				v.warn(fmt.Sprintf("PersistentVolume %s is not %s's", pv.Name, v.Driver))
			}
			c.PVPhase, c.Reclaim = string(pv.Status.Phase), string(pv.Spec.PersistentVolumeReclaimPolicy)
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
			v.warn(fmt.Sprintf("PersistentVolume %s: %v", c.PV, err))
		default:
			return fmt.Errorf("reading PersistentVolume %s: %w", c.PV, err)
		}
	}
	c.addEncryption(scParams)
	return v.addIOLimits(ctx, c, scParams)
}

// addEncryption reads the PV (what was made), else the StorageClass (what will be).
func (c *Claim) addEncryption(params map[string]string) {
	switch {
	case c.Attributes[volume.ParamEncryption] != "":
		c.Encryption, c.KeyID = c.Attributes[volume.ParamEncryption], c.Attributes[volume.ContextKeyID]
	case c.PV != "" && c.Attributes != nil:
		c.Encryption = volume.EncryptionNone
	case params[volume.ParamEncryption] != "":
		c.Encryption = params[volume.ParamEncryption]
	case params != nil:
		c.Encryption = volume.EncryptionNone
	}
}

func (c *Claim) addEvents(events []corev1.Event, kind, name string) {
	for i := range events {
		e := &events[i]
		if e.InvolvedObject.Kind != kind || e.InvolvedObject.Name != name {
			continue
		}
		from := e.Source.Component
		if from == "" {
			from = e.ReportingController
		}
		c.Events = append(c.Events, Event{Object: kind + "/" + name, Type: e.Type, Reason: e.Reason, From: from,
			Message: e.Message, Count: e.Count, LastSeen: eventTime(e)})
	}
}

// metrics are the series to watch for this claim (docs/metrics.md).
func (c *Claim) metrics() []string {
	out := []string{
		fmt.Sprintf(`kubelet_volume_stats_used_bytes{namespace=%q,persistentvolumeclaim=%q}`, c.Namespace, c.Name),
		fmt.Sprintf(`kubelet_volume_stats_capacity_bytes{namespace=%q,persistentvolumeclaim=%q}`, c.Namespace, c.Name),
		fmt.Sprintf(`kubelet_volume_stats_inodes_used{namespace=%q,persistentvolumeclaim=%q}`, c.Namespace, c.Name),
	}
	if c.DeviceClass != "" {
		out = append(out,
			fmt.Sprintf(`carve_phase_duration_seconds_count{device_class=%q,result!="OK"}`, c.DeviceClass),
			fmt.Sprintf(`carve_capacity_available_bytes{device_class=%q}`, c.DeviceClass),
			fmt.Sprintf(`carve_thin_pool_data_percent{device_class=%q}`, c.DeviceClass))
	}
	if c.VolumeGroup != "" {
		out = append(out, fmt.Sprintf(`carve_volume_group_free_bytes{volume_group=%q}`, c.VolumeGroup))
	}
	if c.Node != "" {
		out = append(out, fmt.Sprintf(`carve_volumes_missing{node=%q}`, c.Node))
	}
	return out
}
