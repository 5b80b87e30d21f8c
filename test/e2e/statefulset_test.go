//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/volume"
)

// newStatefulSet returns a StatefulSet of replicas pods, each with a PVC of
// size from a volumeClaimTemplate. Pods start in parallel: with no kubelet
// none ever becomes Ready, which OrderedReady would wait for.
func newStatefulSet(ns, name, sc, size string, replicas int32) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	pod := newPod(ns, "", "data")
	pod.Spec.Volumes = nil
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            &replicas,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			ServiceName:         name,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       pod.Spec,
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: &sc,
					Resources: corev1.VolumeResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
					},
				},
			}},
		},
	}
}

// Scenario 5: a StatefulSet of 6 replicas: every PVC Bound, each LV on its
// pod's node, and each node's published capacity down by what it holds.
// Scenario 6: deleting the PVCs (reclaimPolicy Delete) removes the LVs and
// the PVs, and the capacity comes back.
func TestStatefulSetSixReplicas(t *testing.T) {
	waitCapacitySettled(t, 3*time.Minute)
	ns := newNamespace(t, "sts")
	ctx := testCtx(t, 8*time.Minute)
	before := nodeCapacities(t, ctx, thickSC)
	const replicas, size = 6, "512Mi"
	if _, err := bed.Client.AppsV1().StatefulSets(ns).Create(ctx, newStatefulSet(ns, "db", thickSC, size, replicas), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StatefulSet: %v", err)
	}
	pvcs := make([]*corev1.PersistentVolumeClaim, replicas)
	for i := range replicas {
		pvcs[i] = waitBound(t, ns, fmt.Sprintf("data-db-%d", i), 2*time.Minute)
	}
	held := map[string]int64{}
	var pvNames []string
	for i := range replicas {
		node := waitPodNode(t, ns, fmt.Sprintf("db-%d", i), settle)
		checkVolumeOnNode(t, ctx, pvcs[i], node)
		held[node] += pvcs[i].Spec.Resources.Requests.Storage().Value()
		pvNames = append(pvNames, pvcs[i].Spec.VolumeName)
	}
	t.Logf("volumes per node (bytes): %v", held)
	after := map[string]int64{}
	for node, c := range before {
		after[node] = c - held[node]
	}
	waitCapacities(t, 30*time.Second, "each node's published capacity to drop by the volumes it holds", thickSC, after)

	t.Run("deleting the PVCs removes the LVs and PVs", func(t *testing.T) {
		start := time.Now()
		deleteNamespaceVolumes(t, ns)
		ctx := testCtx(t, 2*time.Minute)
		for _, pv := range pvNames {
			if _, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{}); err == nil {
				t.Errorf("PV %s still exists", pv)
			}
			nodes, _, err := lvOfPV(ctx, pv)
			if err != nil {
				t.Fatal(err)
			}
			if len(nodes) != 0 {
				t.Errorf("LV %s of deleted PV %s still on %v", volume.LVNameFor(pv), pv, nodes)
			}
		}
		waitCapacities(t, 30*time.Second, "capacity of every node to come back", thickSC, before)
		t.Logf("%d PVCs deleted; PVs and LVs gone and capacity back in %s", replicas, time.Since(start).Round(time.Millisecond))
	})
}
