package view

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/carve-csi/carve/internal/volume"
)

var t0 = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

func node(name, group string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if group != "" {
		n.Labels = map[string]string{nodeGroupLabel: group}
	}
	return n
}

func agentPod(name, nodeName, image string, ready bool, mutate func(*corev1.Pod)) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "carve-system", Name: name, CreationTimestamp: metav1.NewTime(t0),
			Labels: map[string]string{"app.kubernetes.io/name": "carve", "app.kubernetes.io/component": "node"}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "carve", Image: image}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &metav1.Time{Time: t0},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status, Message: "containers with unready status: [carve]"}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func csiNode(name string, drivers ...string) *storagev1.CSINode {
	n := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, d := range drivers {
		n.Spec.Drivers = append(n.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: name})
	}
	return n
}

func endpointSlice(ready map[string]bool) *discoveryv1.EndpointSlice {
	return serviceSlice("carve-node", ready)
}

func serviceSlice(service string, ready map[string]bool) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "carve-system", Name: service + "-x",
		Labels: map[string]string{discoveryv1.LabelServiceName: service}}}
	for n, r := range ready {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{NodeName: &n, Conditions: discoveryv1.EndpointConditions{Ready: &r}})
	}
	return s
}

func nodesFixture() []runtime.Object {
	probe := event("carve-system", "u1", "Pod", "carve-node-b", reasonUnhealthy,
		"Readiness probe failed: HTTP probe failed with statuscode: 503", t0)
	probe.InvolvedObject.Namespace = "carve-system"
	return []runtime.Object{
		sc("carve-thick", driver, "thick"), sc("carve-thin", driver, "thin"),
		node("n1", ""), node("n2", "fast"), node("n3", ""), node("n4", "none"), node("n5", ""),
		agentPod("carve-node-a", "n1", "ghcr.io/carve-csi/carve:v0.1.0", true, nil),
		agentPod("carve-node-b", "n2", "registry:5000/carve:v0.2.0@sha256:abc", false, nil),
		agentPod("carve-node-c", "n3", "carve:dev", false, func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "carve", State: corev1.ContainerState{
				Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s"}}}}
		}),
		csiNode("n1", driver), csiNode("n2", driver, "other"), csiNode("n3", "other"),
		endpointSlice(map[string]bool{"n1": true, "n2": false}),
		capacity("c1", "n1", "carve-thick", "10Gi"), capacity("c2", "n1", "carve-thin", "40Gi"),
		capacity("c3", "n2", "carve-thick", "0"),
		probe,
	}
}

func TestNodes(t *testing.T) {
	got, err := View{Client: fake.NewClientset(nodesFixture()...), Driver: driver}.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].Created = got[i].Created.UTC()
	}
	want := []Node{
		{Node: "n1", Pod: "carve-system/carve-node-a", Agent: "Ready", Channel: "Ready", Registered: true, Version: "v0.1.0",
			Free: map[string]int64{"thick": 10 << 30, "thin": 40 << 30}, Created: t0},
		{Node: "n2", Group: "fast", Pod: "carve-system/carve-node-b", Agent: "NotReady", Channel: "NotReady", Registered: true,
			Reason: "Readiness probe failed: HTTP probe failed with statuscode: 503", Version: "v0.2.0",
			Free: map[string]int64{"thick": 0}, Created: t0},
		{Node: "n3", Pod: "carve-system/carve-node-c", Agent: "NotReady", Channel: "None", Reason: "CrashLoopBackOff back-off 5m0s",
			Version: "dev", Created: t0},
		{Node: "n5", Agent: "NoPod", Channel: "None", Reason: "no carve node pod on this node"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Nodes:\n got %+v\nwant %+v", got, want)
	}
}

// TestNodesAgentService: the channel state comes from the Service named
// by AgentService (a chart installed with nameOverride), not carve-node's.
func TestNodesAgentService(t *testing.T) {
	objs := []runtime.Object{node("n1", ""), agentPod("carve-node-a", "n1", "carve:dev", true, nil),
		endpointSlice(map[string]bool{"n1": false}), serviceSlice("store-node", map[string]bool{"n1": true})}
	for _, tc := range []struct{ service, want string }{{"", "NotReady"}, {"store-node", "Ready"}, {"other", "None"}} {
		got, err := View{Client: fake.NewClientset(objs...), Driver: driver, AgentService: tc.service}.Nodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Channel != tc.want {
			t.Errorf("AgentService %q: %+v, want channel %s", tc.service, got, tc.want)
		}
	}
}

func snapshotObj(ns, name, claim, content string, ready bool) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec": map[string]any{"source": map[string]any{"persistentVolumeClaimName": claim},
			"volumeSnapshotClassName": "carve-snap"},
		"status": map[string]any{"boundVolumeSnapshotContentName": content, "readyToUse": ready, "restoreSize": "1Gi"},
	}}
	u.SetCreationTimestamp(metav1.NewTime(t0))
	return u
}

func contentObj(name, drv, handle string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"driver": drv},
		"status":   map[string]any{"snapshotHandle": handle},
	}}
}

func dynamicFixture(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	if objs == nil {
		objs = []runtime.Object{
			snapshotObj("db", "snap-1", "data-0", "content-1", true),
			snapshotObj("db", "snap-2", "data-1", "content-2", false),
			snapshotObj("db", "ebs-snap", "ebs", "content-3", true),
			snapshotObj("web", "snap-3", "waiting", "content-4", true),
			contentObj("content-1", driver, "n1/carve/carvesnap-0123abcd"),
			contentObj("content-2", driver, ""),
			contentObj("content-3", "ebs.csi.aws.com", "snap-0xyz"),
			contentObj("content-4", driver, "n2/carve/carvesnap-99"),
		}
	}
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		SnapshotResource: "VolumeSnapshotList", SnapshotContentResource: "VolumeSnapshotContentList"}, objs...)
}

func TestSnapshots(t *testing.T) {
	for _, tc := range []struct {
		namespace string
		want      []string
	}{
		{"db", []string{"db/snap-1 data-0 n1 carve/carvesnap-0123abcd true", "db/snap-2 data-1  / false"}},
		{"", []string{"db/snap-1 data-0 n1 carve/carvesnap-0123abcd true", "db/snap-2 data-1  / false",
			"web/snap-3 waiting n2 carve/carvesnap-99 true"}},
	} {
		got, err := View{Client: fake.NewClientset(), Dynamic: dynamicFixture(), Driver: driver, Namespace: tc.namespace}.Snapshots(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var rows []string
		for _, s := range got {
			if s.SizeBytes != 1<<30 || s.Class != "carve-snap" {
				t.Errorf("%s/%s: size %d class %q, want 1Gi carve-snap", s.Namespace, s.Name, s.SizeBytes, s.Class)
			}
			rows = append(rows, fmt.Sprintf("%s/%s %s %s %s/%s %v", s.Namespace, s.Name, s.SourceClaim, s.Node, s.VolumeGroup, s.LV, s.ReadyToUse))
		}
		if !reflect.DeepEqual(rows, tc.want) {
			t.Errorf("Snapshots(namespace %q):\n got %q\nwant %q", tc.namespace, rows, tc.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	objs := fixture()
	claim := pvc("db", "data-0", "carve-thick", corev1.ClaimBound, t0, map[string]string{selectedNodeAnnotation: "n1"})
	claim.Spec.VolumeName = "pv-a"
	claim.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	claim.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	claim.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	for i, o := range objs {
		if c, ok := o.(*corev1.PersistentVolumeClaim); ok && c.Name == "data-0" {
			objs[i] = claim
		}
	}
	pvEvent := event("default", "p1", "PersistentVolume", "pv-a", "VolumeDataMissing", "the LV is gone", t0.Add(time.Hour))
	objs = append(objs,
		event("db", "c1", "PersistentVolumeClaim", "data-0", "ProvisioningSucceeded", "provisioned pv-a", t0),
		event("db", "c2", "PersistentVolumeClaim", "data-1", "ProvisioningSucceeded", "not this claim", t0),
		pvEvent)
	var warnings []string
	v := View{Client: fake.NewClientset(objs...), Driver: driver, Namespace: "db", Warn: func(m string) { warnings = append(warnings, m) }}
	got, err := v.Describe(context.Background(), "data-0")
	if err != nil {
		t.Fatal(err)
	}
	if got.PV != "pv-a" || got.Node != "n1" || got.VolumeGroup != "carve" || got.LV != "carve-a" || got.DeviceClass != "thick" ||
		got.StorageClass != "carve-thick" || got.SizeBytes != 1<<30 || !reflect.DeepEqual(got.Pods, []string{"db/db-0"}) ||
		got.VolumeHandle != "carve/carve-a" || got.Attributes[deviceClassParam] != "thick" || got.PVPhase != "Bound" {
		t.Errorf("Describe: %+v", got)
	}
	var reasons []string
	for _, e := range got.Events {
		reasons = append(reasons, e.Object+" "+e.Reason)
	}
	if want := []string{"PersistentVolumeClaim/data-0 ProvisioningSucceeded", "PersistentVolume/pv-a VolumeDataMissing"}; !reflect.DeepEqual(reasons, want) {
		t.Errorf("events %q, want %q", reasons, want)
	}
	metrics := strings.Join(got.Metrics, "\n")
	for _, m := range []string{`kubelet_volume_stats_used_bytes{namespace="db",persistentvolumeclaim="data-0"}`,
		`carve_volume_group_free_bytes{volume_group="carve"}`, `carve_volumes_missing{node="n1"}`,
		`carve_phase_duration_seconds_count{device_class="thick",result!="OK"}`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s:\n%s", m, metrics)
		}
	}
	if len(warnings) != 0 {
		t.Errorf("warnings %q", warnings)
	}
	if _, err := v.Describe(context.Background(), "nope"); !apierrors.IsNotFound(err) {
		t.Errorf("Describe of a missing claim: %v, want NotFound", err)
	}
}

// forbid makes the fake API refuse to list (and get) resources, as it
// does to a user with rights in one namespace only.
func forbid(cs *fake.Clientset, resources ...string) {
	for _, r := range resources {
		for _, verb := range []string{"list", "get"} {
			cs.PrependReactor(verb, r, func(a k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: r}, "", fmt.Errorf("namespaced user"))
			})
		}
	}
}

// TestNamespacedRights: a user who may read only their namespace's
// claims, pods and events still gets their namespace's volumes, pending
// claims and snapshots, with a warning for what is left out.
func TestNamespacedRights(t *testing.T) {
	bound := pvc("db", "data-0", "carve-thick", corev1.ClaimBound, t0, map[string]string{
		provisionerAnnotation: driver, selectedNodeAnnotation: "n1"})
	bound.Spec.VolumeName = "pv-a"
	bound.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	waiting := pvc("db", "waiting", "carve-thick", corev1.ClaimPending, t0, map[string]string{betaProvisionerAnnotation: driver})
	other := pvc("db", "ebs", "gp3", corev1.ClaimBound, t0, map[string]string{provisionerAnnotation: "ebs.csi.aws.com"})
	other.Spec.VolumeName = "pv-x"
	cs := fake.NewClientset(bound, waiting, other, pod("db", "db-0", "data-0"))
	forbid(cs, "persistentvolumes", "storageclasses")
	dyn := dynamicFixture(snapshotObj("db", "snap-1", "data-0", "content-1", true), snapshotObj("db", "snap-x", "ebs", "content-3", true))
	dyn.PrependReactor("list", "volumesnapshotcontents", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(SnapshotContentResource.GroupResource(), "", fmt.Errorf("namespaced user"))
	})
	var warnings []string
	v := View{Client: cs, Dynamic: dyn, Driver: driver, Namespace: "db", Warn: func(m string) { warnings = append(warnings, m) }}
	ctx := context.Background()

	vols, err := v.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []Volume{{PV: "pv-a", Claim: "db/data-0", Pods: []string{"db/db-0"}, Node: "n1", SizeBytes: 1 << 30, Phase: "Bound",
		StorageClass: "carve-thick", Created: t0}}
	for i := range vols {
		vols[i].Created = vols[i].Created.UTC()
	}
	if !reflect.DeepEqual(vols, want) {
		t.Errorf("Volumes:\n got %+v\nwant %+v", vols, want)
	}
	pend, err := v.PendingClaims(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pend) != 1 || pend[0].Claim != "db/waiting" {
		t.Errorf("PendingClaims: %+v, want db/waiting", pend)
	}
	snaps, err := v.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 1 || snaps[0].Name != "snap-1" || snaps[0].Node != "n1" {
		t.Errorf("Snapshots: %+v, want snap-1 on n1", snaps)
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], "PersistentVolumes") || !strings.Contains(warnings[1], "VolumeSnapshotContents") {
		t.Errorf("warnings %q", warnings)
	}

	// Across all namespaces the same refusal is an error, not a guess.
	v.Namespace = ""
	if _, err := v.Volumes(ctx); !apierrors.IsForbidden(err) {
		t.Errorf("Volumes of all namespaces without PV rights: %v, want Forbidden", err)
	}
}

// TestVolumesOfOneNamespace: with a Namespace, the volumes of its claims
// only, and the pods of that namespace only are listed.
func TestVolumesOfOneNamespace(t *testing.T) {
	cs := fake.NewClientset(fixture()...)
	got, err := View{Client: cs, Driver: driver, Namespace: "db"}.Volumes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Errorf("Volumes of db: %+v", got)
	}
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "pods" && a.GetNamespace() != "db" {
			t.Errorf("listed pods of namespace %q, want db", a.GetNamespace())
		}
	}
	got, err = View{Client: fake.NewClientset(fixture()...), Driver: driver, Namespace: "web"}.Volumes(context.Background())
	if err != nil || len(got) != 0 {
		t.Errorf("Volumes of web: %+v, %v; want none", got, err)
	}
}

// scaled is a cluster of n copies of every kind of object the views read.
func scaled(n int) ([]runtime.Object, []runtime.Object) {
	var objs, dyn []runtime.Object
	objs = append(objs, sc("carve-thick", driver, "thick"))
	for i := range n {
		nn, ns := fmt.Sprintf("n%d", i), fmt.Sprintf("ns%d", i%3)
		name := fmt.Sprintf("c%d", i)
		claim := pvc(ns, name, "carve-thick", corev1.ClaimPending, t0, nil)
		if i%2 == 0 {
			claim.Status.Phase = corev1.ClaimBound
			claim.Spec.VolumeName = "pv-" + name
		}
		objs = append(objs, node(nn, ""), csiNode(nn, driver), agentPod("agent-"+nn, nn, "carve:v1", i%2 == 0, nil),
			capacity("cap-"+nn, nn, "carve-thick", "1Gi"), claim, pod(ns, "p"+name, name),
			pv("pv-"+name, driver, nn, "thick", "carve/carve-"+name, "1Gi", ns, name),
			event(ns, "e"+name, "PersistentVolumeClaim", name, "Provisioning", "x", t0),
			event("carve-system", "u"+name, "Pod", "agent-"+nn, reasonUnhealthy, "503", t0))
		dyn = append(dyn, snapshotObj(ns, "s"+name, name, "content-"+name, true),
			contentObj("content-"+name, driver, nn+"/carve/carvesnap-"+name))
	}
	return append(objs, endpointSlice(map[string]bool{"n0": true})), dyn
}

// TestOneListPerKind: every view makes the same API calls for 3 claims,
// nodes and snapshots as for 30, at most one List per kind of object (two
// Event lists for describe: the claim's and the PV's): no call per row.
func TestOneListPerKind(t *testing.T) {
	views := map[string]func(View) error{
		"volumes":   func(v View) error { _, err := v.Volumes(context.Background()); return err },
		"capacity":  func(v View) error { _, err := v.Capacities(context.Background()); return err },
		"pending":   func(v View) error { _, err := v.PendingClaims(context.Background()); return err },
		"orphans":   func(v View) error { _, err := v.Findings(context.Background()); return err },
		"nodes":     func(v View) error { _, err := v.Nodes(context.Background()); return err },
		"snapshots": func(v View) error { _, err := v.Snapshots(context.Background()); return err },
		"describe":  func(v View) error { _, err := v.Describe(context.Background(), "c0"); return err },
	}
	calls := func(view func(View) error, n int, namespace string) []string {
		objs, dyn := scaled(n)
		cs := fake.NewClientset(objs...)
		dc := dynamicFixture(dyn...)
		if err := view(View{Client: cs, Dynamic: dc, Driver: driver, Namespace: namespace}); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range append(cs.Actions(), dc.Actions()...) {
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
		return out
	}
	for name, view := range views {
		for _, ns := range []string{"", "ns0"} {
			if name == "describe" && ns == "" {
				continue
			}
			small, big := calls(view, 3, ns), calls(view, 30, ns)
			if !reflect.DeepEqual(small, big) {
				t.Errorf("%s (namespace %q): 3 objects take %q, 30 take %q", name, ns, small, big)
			}
			seen := map[string]int{}
			for _, c := range big {
				seen[c]++
				if limit := map[bool]int{true: 2, false: 1}[name == "describe" && c == "list events" || name == "orphans"]; seen[c] > limit {
					t.Errorf("%s (namespace %q): %s %d times: %q", name, ns, c, seen[c], big)
				}
			}
		}
	}
}

// TestDescribeIOLimits: a claim's IO limits are its StorageClass's with
// its current VolumeAttributesClass's over them; a modify csi-resizer
// reports shows as it is.
func TestDescribeIOLimits(t *testing.T) {
	class := sc("carve-limited", driver, "thick")
	class.Parameters[volume.ParamWriteBytesPerSecond] = "4Mi"
	class.Parameters[volume.ParamReadIOPS] = "100"
	vac := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, DriverName: driver,
		Parameters: map[string]string{volume.ParamWriteBytesPerSecond: "8Mi"}}
	claim := pvc("db", "limited", "carve-limited", corev1.ClaimBound, t0, nil)
	fast := "fast"
	claim.Status.CurrentVolumeAttributesClassName = &fast
	claim.Status.ModifyVolumeStatus = &corev1.ModifyVolumeStatus{TargetVolumeAttributesClassName: "bogus",
		Status: corev1.PersistentVolumeClaimModifyVolumeInfeasible}
	v := View{Client: fake.NewClientset(class, vac, claim), Driver: driver, Namespace: "db", Warn: func(m string) { t.Errorf("warning %q", m) }}
	got, err := v.Describe(context.Background(), "limited")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{volume.ParamWriteBytesPerSecond: "8Mi", volume.ParamReadIOPS: "100"}
	if !reflect.DeepEqual(got.IOLimits, want) || got.AttributesClass != "fast" || got.Modify != "Infeasible to bogus" {
		t.Errorf("limits %v, class %q, modify %q; want %v, fast, Infeasible to bogus", got.IOLimits, got.AttributesClass, got.Modify, want)
	}
}

// TestDescribeEncryption: a bound claim's encryption and key ID come from
// its PV; a pending one's from its StorageClass.
func TestDescribeEncryption(t *testing.T) {
	class := sc("carve-enc", driver, "thick")
	class.Parameters[volume.ParamEncryption] = volume.EncryptionLUKS2
	p := pv("pv-e", driver, "n1", "thick", "carve/carve-e", "1Gi", "db", "enc")
	p.Spec.CSI.VolumeAttributes[volume.ParamEncryption] = volume.EncryptionLUKS2
	p.Spec.CSI.VolumeAttributes[volume.ContextKeyID] = "0123456789abcdef0123456789abcdef"
	bound := pvc("db", "enc", "carve-enc", corev1.ClaimBound, t0, nil)
	bound.Spec.VolumeName = "pv-e"
	pending := pvc("db", "enc-pending", "carve-enc", corev1.ClaimPending, t0, nil)
	plain := pvc("db", "plain", "carve-thick", corev1.ClaimPending, t0, nil)
	v := View{Client: fake.NewClientset(class, sc("carve-thick", driver, "thick"), p, bound, pending, plain), Driver: driver, Namespace: "db",
		Warn: func(m string) { t.Errorf("warning %q", m) }}
	for name, want := range map[string][2]string{
		"enc":         {volume.EncryptionLUKS2, "0123456789abcdef0123456789abcdef"},
		"enc-pending": {volume.EncryptionLUKS2, ""},
		"plain":       {volume.EncryptionNone, ""},
	} {
		got, err := v.Describe(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if got.Encryption != want[0] || got.KeyID != want[1] {
			t.Errorf("%s: encryption %q, key ID %q; want %q, %q", name, got.Encryption, got.KeyID, want[0], want[1])
		}
	}
}
