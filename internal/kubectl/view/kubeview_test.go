package view

import (
	"context"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/carve-csi/carve/internal/topology"
)

const driver = "lvm.carve.dev"

func sc(name, provisioner, class string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner,
		Parameters: map[string]string{deviceClassParam: class}}
}

func pv(name, drv, node, class, handle, size, claimNS, claim string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: drv, VolumeHandle: handle, VolumeAttributes: map[string]string{deviceClassParam: class}}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: topology.Key, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
	if claim != "" {
		p.Spec.ClaimRef = &corev1.ObjectReference{Namespace: claimNS, Name: claim}
	}
	return p
}

func withClass(p *corev1.PersistentVolume, class string) *corev1.PersistentVolume {
	p.Spec.StorageClassName = class
	return p
}

func pod(ns, name, claim string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{Volumes: []corev1.Volume{{
		Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
}

func capacity(name, node, scName, size string) *storagev1.CSIStorageCapacity {
	q := resource.MustParse(size)
	return &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Namespace: "carve-system", Name: name},
		NodeTopology: &metav1.LabelSelector{MatchLabels: map[string]string{topology.Key: node}}, StorageClassName: scName,
		Capacity: &q, MaximumVolumeSize: &q}
}

func pvc(ns, name, scName string, phase corev1.PersistentVolumeClaimPhase, created time.Time, ann map[string]string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann,
		CreationTimestamp: metav1.NewTime(created)}, Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &scName},
		Status: corev1.PersistentVolumeClaimStatus{Phase: phase}}
}

func event(ns, name, kind, obj, reason, msg string, at time.Time) *corev1.Event {
	return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Namespace: ns, Name: obj}, Reason: reason, Message: msg,
		LastTimestamp: metav1.NewTime(at)}
}

func fixture() []runtime.Object {
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	return []runtime.Object{
		sc("carve-thick", driver, "thick"), sc("carve-thin", driver, "thin"), sc("other", "ebs.csi.aws.com", ""),
		withClass(pv("pv-a", driver, "n1", "thick", "carve/carve-a", "1Gi", "db", "data-0"), "carve-thick"),
		pv("pv-b", driver, "n1", "thin", "carve/carve-b", "2Gi", "db", "data-1"),
		pv("pv-c", driver, "n2", "thick", "carve/carve-c", "3Gi", "db", "data-2"),
		pv("pv-x", "ebs.csi.aws.com", "n1", "", "vol-1", "5Gi", "db", "ebs"),
		pod("db", "db-0", "data-0"), pod("db", "db-2", "data-2"), pod("web", "w", "waiting"),
		capacity("c1", "n1", "carve-thick", "10Gi"), capacity("c2", "n1", "carve-thin", "40Gi"),
		capacity("c3", "n2", "carve-thick", "0"), capacity("c4", "n1", "other", "99Gi"),
		pvc("web", "waiting", "carve-thick", corev1.ClaimPending, t0, map[string]string{selectedNodeAnnotation: "n2"}),
		pvc("web", "unused", "carve-thin", corev1.ClaimPending, t0.Add(time.Minute), nil),
		pvc("web", "elsewhere", "other", corev1.ClaimPending, t0, nil),
		pvc("db", "data-0", "carve-thick", corev1.ClaimBound, t0, nil),
		event("web", "e1", "PersistentVolumeClaim", "waiting", "WaitForFirstConsumer", "waiting for first consumer", t0),
		event("web", "e2", "PersistentVolumeClaim", "waiting", "ProvisioningFailed", "ResourceExhausted: no room on n2", t0.Add(2*time.Minute)),
		event("web", "e3", "Pod", "w", "FailedScheduling", "not this one", t0.Add(3*time.Minute)),
	}
}

func TestVolumes(t *testing.T) {
	got, err := View{Client: fake.NewClientset(fixture()...), Driver: driver}.Volumes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []Volume{
		{PV: "pv-a", Claim: "db/data-0", Pods: []string{"db/db-0"}, Node: "n1", DeviceClass: "thick", VolumeGroup: "carve", LV: "carve-a", SizeBytes: 1 << 30, Phase: "Bound", StorageClass: "carve-thick"},
		{PV: "pv-b", Claim: "db/data-1", Node: "n1", DeviceClass: "thin", VolumeGroup: "carve", LV: "carve-b", SizeBytes: 2 << 30, Phase: "Bound"},
		{PV: "pv-c", Claim: "db/data-2", Pods: []string{"db/db-2"}, Node: "n2", DeviceClass: "thick", VolumeGroup: "carve", LV: "carve-c", SizeBytes: 3 << 30, Phase: "Bound"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Volumes:\n got %+v\nwant %+v", got, want)
	}
}

func TestCapacities(t *testing.T) {
	got, err := View{Client: fake.NewClientset(fixture()...), Driver: driver}.Capacities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []Capacity{
		{Name: "c1", Node: "n1", DeviceClass: "thick", StorageClass: "carve-thick", CapacityBytes: 10 << 30, MaximumVolumeSize: 10 << 30, Volumes: 1, ProvisionedBytes: 1 << 30},
		{Name: "c2", Node: "n1", DeviceClass: "thin", StorageClass: "carve-thin", CapacityBytes: 40 << 30, MaximumVolumeSize: 40 << 30, Volumes: 1, ProvisionedBytes: 2 << 30},
		{Name: "c3", Node: "n2", DeviceClass: "thick", StorageClass: "carve-thick", Volumes: 1, ProvisionedBytes: 3 << 30},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Capacities:\n got %+v\nwant %+v", got, want)
	}
}

func TestPendingClaims(t *testing.T) {
	got, err := View{Client: fake.NewClientset(fixture()...), Driver: driver}.PendingClaims(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	want := []Pending{
		{Claim: "web/waiting", StorageClass: "carve-thick", SelectedNode: "n2", Pods: []string{"web/w"}, Since: t0,
			Reason: "ProvisioningFailed", Message: "ResourceExhausted: no room on n2"},
		{Claim: "web/unused", StorageClass: "carve-thin", Since: t0.Add(time.Minute)},
	}
	for i := range got {
		got[i].Since = got[i].Since.UTC()
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PendingClaims:\n got %+v\nwant %+v", got, want)
	}
}

func TestFindings(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	orphan := event("", "o1", "Node", "n1", reasonOrphan, "LV carve/carve-1 has had no PersistentVolume", t0)
	orphan.Count = 3
	objs := []runtime.Object{
		orphan,
		event("", "m1", "PersistentVolume", "pv-gone", reasonMissing, "the LV of PersistentVolume pv-gone is gone", t0.Add(time.Minute)),
		event("db", "m2", "PersistentVolumeClaim", "data-9", reasonMissing, "the same, on the claim", t0.Add(time.Minute)),
		event("", "x", "Node", "n1", "NodeReady", "not a finding", t0.Add(2*time.Minute)),
		// --remove-orphans: the quarantine, the removal, a PV naming a
		// quarantined LV (its copy on the PV is left out).
		event("", "q1", "Node", "n1", reasonQuarantined, "quarantined orphaned LV carve/carve-1 as carve/carve-orphan-1", t0.Add(3*time.Minute)),
		event("", "r1", "Node", "n1", reasonRemoved, "removed orphaned LV carve/carve-orphan-1", t0.Add(5*time.Minute)),
		event("", "c1", "Node", "n2", reasonClaimed, "PersistentVolume pv-x names LV carve/carve-2", t0.Add(4*time.Minute)),
		event("", "c2", "PersistentVolume", "pv-x", reasonClaimed, "PersistentVolume pv-x names LV carve/carve-2", t0.Add(4*time.Minute)),
	}
	got, err := View{Client: fake.NewClientset(objs...), Driver: driver}.Findings(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].LastSeen = got[i].LastSeen.UTC()
	}
	want := []Finding{
		{Kind: reasonRemoved, Object: "node/n1", Message: "removed orphaned LV carve/carve-orphan-1", LastSeen: t0.Add(5 * time.Minute)},
		{Kind: reasonClaimed, Object: "node/n2", Message: "PersistentVolume pv-x names LV carve/carve-2", LastSeen: t0.Add(4 * time.Minute)},
		{Kind: reasonQuarantined, Object: "node/n1", Message: "quarantined orphaned LV carve/carve-1 as carve/carve-orphan-1", LastSeen: t0.Add(3 * time.Minute)},
		{Kind: reasonMissing, Object: "persistentvolume/pv-gone", Message: "the LV of PersistentVolume pv-gone is gone", LastSeen: t0.Add(time.Minute)},
		{Kind: reasonOrphan, Object: "node/n1", Message: "LV carve/carve-1 has had no PersistentVolume", Count: 3, LastSeen: t0},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Findings:\n got %+v\nwant %+v", got, want)
	}
}
