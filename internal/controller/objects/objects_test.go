package objects

import (
	"maps"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/carve-csi/carve/internal/volume"
)

const driver = "carve.dev"

// countLists counts the lists of resource the client answers.
func countLists(client *fake.Clientset, resource string) *atomic.Int32 {
	var lists atomic.Int32
	client.PrependReactor("list", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return false, nil, nil
	})
	return &lists
}

// newCache is a Cache over client until the test ends.
func newCache(t *testing.T, client *fake.Clientset) *Cache {
	t.Helper()
	c := New(client, driver, t.Context().Done())
	t.Cleanup(c.Shutdown)
	return c
}

// TestEachKindListedOnce: however many duties ask for the PVs, and
// however often they start the cache, the API server is asked once.
func TestEachKindListedOnce(t *testing.T) {
	client := fake.NewClientset(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}})
	lists := countLists(client, "persistentvolumes")
	c := newCache(t, client)
	a := c.PersistentVolumes()
	c.Start()
	b := c.PersistentVolumes()
	c.Start()
	if a.GetStore() != b.GetStore() {
		t.Fatal("two caches of PVs")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !a.HasSynced() {
		if time.Now().After(deadline) {
			t.Fatal("the PVs were never listed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := lists.Load(); n != 1 {
		t.Errorf("PVs listed %d times, want once", n)
	}
	if _, ok, _ := a.GetStore().GetByKey("pv-1"); !ok {
		t.Error("pv-1 is not in the cache")
	}
}

// TestNothingStartsUnasked: an informer no duty asked for is not started
// by another duty's Start (a standby replica watches PVs only).
func TestNothingStartsUnasked(t *testing.T) {
	client := fake.NewClientset()
	claimLists := countLists(client, "persistentvolumeclaims")
	c := newCache(t, client)
	pvs := c.PersistentVolumes()
	c.Start()
	if !cache.WaitForCacheSync(t.Context().Done(), pvs.HasSynced) {
		t.Fatal("no sync")
	}
	if n := claimLists.Load(); n != 0 {
		t.Errorf("claims listed %d times, though no duty asked for them", n)
	}
}

// TestTrim: each kind keeps what some duty reads and loses the rest.
func TestTrim(t *testing.T) {
	trim := Trim(driver)
	ann := map[string]string{"carve.dev/move-phase": "seeding", "carve.dev/placed-with-source": "x",
		"volume.kubernetes.io/selected-node": "n1", "kubectl.kubernetes.io/last-applied-configuration": "{big}"}
	kept := map[string]string{"carve.dev/move-phase": "seeding", "carve.dev/placed-with-source": "x",
		"volume.kubernetes.io/selected-node": "n1"}
	affinity := &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{}}

	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", Annotations: ann, Labels: map[string]string{"l": "v"}},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "vg/lv", VolumeAttributes: map[string]string{"a": "b"}}},
			NodeAffinity:                  affinity,
			ClaimRef:                      &corev1.ObjectReference{Namespace: "ns", Name: "c"},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
	o, _ := trim(pv)
	got := o.(*corev1.PersistentVolume)
	if got.Spec.CSI == nil || got.Spec.CSI.VolumeHandle != "vg/lv" || got.Spec.CSI.VolumeAttributes != nil || got.Spec.NodeAffinity != affinity ||
		got.Spec.ClaimRef == nil || got.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain ||
		got.Status.Phase != corev1.VolumeBound || !maps.Equal(got.Annotations, kept) || got.Labels != nil {
		t.Errorf("carve's PV trimmed to %+v", got)
	}
	foreign := pv.DeepCopy()
	foreign.Spec.CSI.Driver = "other"
	o, _ = trim(foreign)
	if got := o.(*corev1.PersistentVolume); got.Name != "pv" || got.Spec.CSI != nil || got.Annotations != nil {
		t.Errorf("another driver's PV trimmed to %+v", got)
	}

	class := "thin"
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", Annotations: ann, Labels: map[string]string{"l": "v"}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeName: "pv",
			DataSource: &corev1.TypedLocalObjectReference{Kind: "VolumeSnapshot", Name: "s"},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse("1Gi"), "other": resource.MustParse("1")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending}}
	o, _ = trim(claim)
	gotClaim := o.(*corev1.PersistentVolumeClaim)
	if !maps.Equal(gotClaim.Annotations, kept) || gotClaim.Labels != nil || gotClaim.Spec.StorageClassName != &class ||
		gotClaim.Spec.DataSource == nil || gotClaim.Spec.VolumeName != "pv" || len(gotClaim.Spec.Resources.Requests) != 1 ||
		gotClaim.Status.Phase != corev1.ClaimPending {
		t.Errorf("claim trimmed to %+v", gotClaim)
	}

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"zone": "a"}, Annotations: ann},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{{Key: "t"}}, PodCIDR: "10.0.0.0/24"},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}, Images: []corev1.ContainerImage{{}}}}
	o, _ = trim(node)
	if got := o.(*corev1.Node); got.Labels["zone"] != "a" || len(got.Spec.Taints) != 1 || got.Status.Allocatable.Cpu().IsZero() ||
		got.Annotations != nil || got.Spec.PodCIDR != "" || got.Status.Images != nil {
		t.Errorf("node trimmed to %+v", got)
	}

	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "sc"}, Provisioner: driver, VolumeBindingMode: &wffc,
		Parameters: map[string]string{volume.ParamDeviceClass: "ssd", "other": "x"}}
	o, _ = trim(sc)
	if got := o.(*storagev1.StorageClass); got.Provisioner != driver || got.VolumeBindingMode == nil ||
		!maps.Equal(got.Parameters, map[string]string{volume.ParamDeviceClass: "ssd"}) {
		t.Errorf("StorageClass trimmed to %+v", got)
	}

	tomb := cache.DeletedFinalStateUnknown{Key: "pv"}
	if o, _ := trim(tomb); o != tomb {
		t.Errorf("a tombstone became %v", o)
	}
}
