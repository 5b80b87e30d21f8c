// Package objects is the controller process's one cache of PVs, claims,
// Nodes and StorageClasses, each watched once however many duties read it,
// and trimmed to what they read. A duty asks for its informers, adds its
// indexers and handlers, then calls Start; informers run until the process
// ends, so a standby replica watches only what its duties need. Objects
// scoped to a namespace, label or field are listed apart by their duty,
// as are the capacity writer's StorageClasses (made anew each term).
package objects

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/carve-csi/carve/internal/volume"
)

// Cache hands out the process's shared informers.
type Cache struct {
	factory informers.SharedInformerFactory
	stop    <-chan struct{}
}

// New returns the cache of driver's objects; its informers run until stop
// is closed.
func New(client kubernetes.Interface, driver string, stop <-chan struct{}) *Cache {
	return &Cache{
		factory: informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(Trim(driver))),
		stop:    stop,
	}
}

// PersistentVolumes is the informer of every PV (others' by name only).
func (c *Cache) PersistentVolumes() cache.SharedIndexInformer {
	return c.factory.Core().V1().PersistentVolumes().Informer()
}

// Claims is the informer of every PersistentVolumeClaim.
func (c *Cache) Claims() cache.SharedIndexInformer {
	return c.factory.Core().V1().PersistentVolumeClaims().Informer()
}

// Nodes is the informer of every Node.
func (c *Cache) Nodes() cache.SharedIndexInformer {
	return c.factory.Core().V1().Nodes().Informer()
}

// StorageClasses is the informer of every StorageClass.
func (c *Cache) StorageClasses() cache.SharedIndexInformer {
	return c.factory.Storage().V1().StorageClasses().Informer()
}

// Start starts the requested informers that do not run yet.
func (c *Cache) Start() { c.factory.Start(c.stop) }

// Shutdown waits for the informers to end once stop is closed.
func (c *Cache) Shutdown() { c.factory.Shutdown() }

// carveAnnotations prefixes carve's annotations on claims and PVs.
const (
	carveAnnotations = "carve.dev/"
	selectedNode     = "volume.kubernetes.io/selected-node"
)

// Trim is the cache's transform: only what some duty reads reaches memory.
func Trim(driver string) cache.TransformFunc {
	return func(o any) (any, error) {
		switch v := o.(type) {
		case *corev1.PersistentVolume:
			return trimPV(v, driver), nil
		case *corev1.PersistentVolumeClaim:
			return trimClaim(v), nil
		case *corev1.Node:
			out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: v.Name, UID: v.UID, ResourceVersion: v.ResourceVersion, Labels: v.Labels}}
			out.Spec.Taints = v.Spec.Taints
			out.Spec.Unschedulable = v.Spec.Unschedulable
			out.Status.Allocatable = v.Status.Allocatable
			return out, nil
		case *storagev1.StorageClass:
			out := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: v.Name, UID: v.UID, ResourceVersion: v.ResourceVersion},
				Provisioner: v.Provisioner, VolumeBindingMode: v.VolumeBindingMode}
			if dc, ok := v.Parameters[volume.ParamDeviceClass]; ok {
				out.Parameters = map[string]string{volume.ParamDeviceClass: dc}
			}
			return out, nil
		}
		return o, nil // a tombstone: kept as it is
	}
}

// trimPV keeps another driver's PV by name; of driver's, what the duties
// read: a few hundred bytes per PV.
func trimPV(v *corev1.PersistentVolume, driver string) *corev1.PersistentVolume {
	out := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: v.Name, UID: v.UID,
		ResourceVersion: v.ResourceVersion, DeletionTimestamp: v.DeletionTimestamp}}
	if v.Spec.CSI == nil || v.Spec.CSI.Driver != driver {
		return out
	}
	out.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: v.Spec.CSI.VolumeHandle}
	if id, ok := v.Spec.CSI.VolumeAttributes[volume.ContextKeyID]; ok {
		// The key ID the controller releases an encrypted volume's key for.
		out.Spec.CSI.VolumeAttributes = map[string]string{volume.ContextKeyID: id}
	}
	out.Spec.NodeAffinity = v.Spec.NodeAffinity
	out.Spec.ClaimRef = v.Spec.ClaimRef
	out.Spec.PersistentVolumeReclaimPolicy = v.Spec.PersistentVolumeReclaimPolicy
	out.Status.Phase = v.Status.Phase
	out.Annotations = keepAnnotations(v.Annotations)
	return out
}

// trimClaim keeps what places a claim and carve's annotations.
func trimClaim(v *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	out := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: v.Name, Namespace: v.Namespace, UID: v.UID,
		ResourceVersion: v.ResourceVersion, DeletionTimestamp: v.DeletionTimestamp}}
	out.Annotations = keepAnnotations(v.Annotations)
	out.Spec.StorageClassName = v.Spec.StorageClassName
	out.Spec.DataSource = v.Spec.DataSource
	out.Spec.DataSourceRef = v.Spec.DataSourceRef
	out.Spec.VolumeName = v.Spec.VolumeName
	if q, ok := v.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		out.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: q}
	}
	out.Status.Phase = v.Status.Phase
	return out
}

func keepAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		if strings.HasPrefix(k, carveAnnotations) || k == selectedNode {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
