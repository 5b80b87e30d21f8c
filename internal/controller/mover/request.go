package mover

import (
	"context"
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/volume"
)

// targetRequest is the CreateVolume csi-provisioner would send for the claim
// on the target node, restored from seed. why says why it cannot be made.
func (m *Mover) targetRequest(ctx context.Context, mv move, seed string) (_ *csi.CreateVolumeRequest, why string, _ error) {
	pv := mv.pv
	sc, err := m.cfg.Client.StorageV1().StorageClasses().Get(ctx, pv.Spec.StorageClassName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Sprintf("its StorageClass %s does not exist: the target's parameters are not known", pv.Spec.StorageClassName), nil
	}
	if err != nil {
		return nil, "", err
	}
	params := map[string]string{}
	for k, v := range sc.Parameters {
		// csi-provisioner's own keys (secrets, fsType) never reach a driver.
		if !strings.HasPrefix(k, "csi.storage.k8s.io/") {
			params[k] = v
		}
	}
	params[volume.ParamPVCName], params[volume.ParamPVCNamespace], params[volume.ParamPVName] = mv.name, mv.ns, mv.target
	// The claim's current limits (VolumeAttributesClass) go with the volume.
	var mutable map[string]string
	if vac := pv.Spec.VolumeAttributesClassName; vac != nil && *vac != "" {
		c, err := m.cfg.Client.StorageV1().VolumeAttributesClasses().Get(ctx, *vac, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("its VolumeAttributesClass %s does not exist: the target's IO limits are not known", *vac), nil
		}
		if err != nil {
			return nil, "", err
		}
		mutable = c.Parameters
	}
	size := pv.Spec.Capacity[corev1.ResourceStorage]
	top := []*csi.Topology{{Segments: map[string]string{m.cfg.TopologyKey: mv.to}}}
	return &csi.CreateVolumeRequest{
		Name:                      mv.target,
		CapacityRange:             &csi.CapacityRange{RequiredBytes: size.Value()},
		VolumeCapabilities:        capabilities(pv),
		Parameters:                params,
		MutableParameters:         mutable,
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: top, Preferred: top},
		VolumeContentSource:       &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: seed}}},
	}, "", nil
}

// capabilities are the PV's access modes and type as csi-provisioner sends
// them.
func capabilities(pv *corev1.PersistentVolume) []*csi.VolumeCapability {
	access := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
		FsType: pv.Spec.CSI.FSType, MountFlags: pv.Spec.MountOptions}}}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		access = &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	}
	var out []*csi.VolumeCapability
	for _, am := range pv.Spec.AccessModes {
		mode := csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		switch am {
		case corev1.ReadWriteOncePod:
			mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		case corev1.ReadOnlyMany:
			mode = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
		case corev1.ReadWriteMany:
			mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		}
		c := &csi.VolumeCapability{AccessType: access.AccessType, AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
		out = append(out, c)
	}
	if len(out) == 0 {
		access.AccessMode = &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER}
		out = append(out, access)
	}
	return out
}
