package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/controller/objects"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/carve-csi/carve/internal/volume"
)

const (
	testDriver = "lvm.carve.dev"
	testKey    = "topology.carve.dev/node"
	ns         = "app"
	gi         = int64(1) << 30
)

// fakeCapacity is the nodes' reports: node -> device class -> max volume
// ("" the default class); a node missing has not reported.
type fakeCapacity map[string]map[string]int64

func (f fakeCapacity) MaxVolume(node, dc string) (int64, bool) {
	n, ok := f[node]
	return n[dc], ok
}

// fakePVs are the PVs by name; nil means the cache is not filled yet.
type fakePVs map[string]*corev1.PersistentVolume

func (f fakePVs) Get(name string) (*corev1.PersistentVolume, error) {
	if f == nil {
		return nil, errors.New("not synced")
	}
	return f[name], nil
}

func class(name, provisioner, dc string, mode storagev1.VolumeBindingMode) *storagev1.StorageClass {
	s := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, VolumeBindingMode: &mode}
	if dc != "" {
		s.Parameters = map[string]string{volume.ParamDeviceClass: dc}
	}
	return s
}

func classes() []runtime.Object {
	return []runtime.Object{
		class("thick", testDriver, "ssd", storagev1.VolumeBindingWaitForFirstConsumer),
		class("default", testDriver, "", storagev1.VolumeBindingWaitForFirstConsumer),
		class("now", testDriver, "ssd", storagev1.VolumeBindingImmediate),
		class("other", "other.csi.example", "", storagev1.VolumeBindingWaitForFirstConsumer),
	}
}

type claimOpt func(*corev1.PersistentVolumeClaim)

func claim(name, sc, size string, opts ...claimOpt) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	for _, o := range opts {
		o(c)
	}
	return c
}

func fromSnapshot(name string) claimOpt {
	g := snapshotGroup
	return func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &g, Kind: kindSnapshot, Name: name}
	}
}

func fromSnapshotDataSource(name string) claimOpt {
	g := snapshotGroup
	return func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &g, Kind: kindSnapshot, Name: name}
	}
}

func fromClaim(name string) claimOpt {
	return func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: kindClaim, Name: name}
	}
}

func annotated(k, v string) claimOpt {
	return func(c *corev1.PersistentVolumeClaim) {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[k] = v
	}
}

func boundTo(pv string) claimOpt {
	return func(c *corev1.PersistentVolumeClaim) {
		c.Spec.VolumeName = pv
		c.Status.Phase = corev1.ClaimBound
	}
}

func pv(name, driver, node string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "vg/" + name}}}}
	if node != "" {
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: testKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	}
	return p
}

// snapshot is a VolumeSnapshot bound to content (none: "").
func snapshot(name, content string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"source": map[string]any{"persistentVolumeClaimName": "src"}},
	}}
	if content != "" {
		u.Object["status"] = map[string]any{"boundVolumeSnapshotContentName": content, "readyToUse": true}
	}
	return u
}

// content is a VolumeSnapshotContent of driver with handle ("": none yet).
func content(name, driver, handle string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"driver": driver, "deletionPolicy": "Delete",
			"source":            map[string]any{"volumeHandle": "vg/src"},
			"volumeSnapshotRef": map[string]any{"name": "snap", "namespace": ns}},
	}}
	if handle != "" {
		u.Object["status"] = map[string]any{"snapshotHandle": handle}
	}
	return u
}

var snapHandle = volume.SnapshotID("node-a", "vg-a", volume.SnapshotLVNameFor("snapshot-1"))

// world is what one case's API server and node reports hold. The API
// server holds nodes node-a and node-b (testNode) and, unless noPod,
// the pending pod pod-c that uses claim c, besides objs.
type world struct {
	objs     []runtime.Object
	dyn      []runtime.Object
	pvs      fakePVs
	capacity fakeCapacity
	noPod    bool
	// nodes, when set, replace node-a and node-b.
	nodes []runtime.Object
}

// testNode is a node with 4 CPUs, 8Gi of memory, room for 10 pods,
// labels zone=z1 and carve's topology label.
func testNode(name string, opts ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{testKey: name, "zone": "z1"}}}
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("10")}
	for _, o := range opts {
		o(n)
	}
	return n
}

// pendingPod is a pod no node is chosen for, that uses claims.
func pendingPod(name string, claims []string, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

type harness struct {
	p      *Placer
	client *fake.Clientset
	dyn    *dynamicfake.FakeDynamicClient
	events *record.FakeRecorder
	ctx    context.Context
	cancel context.CancelFunc
}

func start(t *testing.T, w world) *harness {
	t.Helper()
	nodes := w.nodes
	if nodes == nil {
		nodes = []runtime.Object{testNode("node-a"), testNode("node-b")}
	}
	objs := append(classes(), nodes...)
	if !w.noPod {
		objs = append(objs, pendingPod("pod-c", []string{"c"}))
	}
	client := fake.NewClientset(append(objs, w.objs...)...)
	client.Resources = []*metav1.APIResourceList{{GroupVersion: "snapshot.storage.k8s.io/v1",
		APIResources: []metav1.APIResource{{Name: "volumesnapshots"}, {Name: "volumesnapshotcontents"}}}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		VolumeSnapshots: "VolumeSnapshotList", VolumeSnapshotContents: "VolumeSnapshotContentList"}, w.dyn...)
	rec := record.NewFakeRecorder(100)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cached := objects.New(client, testDriver, ctx.Done())
	t.Cleanup(cached.Shutdown)
	t.Cleanup(cancel) // before the Shutdown: cleanups run last first
	p, err := New(Config{Client: client, Objects: cached, Dynamic: dyn, Driver: testDriver, TopologyKey: testKey,
		Capacity: w.capacity, PVs: w.pvs, Events: rec, Registerer: prometheus.NewPedanticRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{p: p, client: client, dyn: dyn, events: rec, ctx: ctx, cancel: cancel}
}

// informers fills the caches without running the workers, so that a test
// calls sync itself.
func (h *harness) informers(t *testing.T) {
	t.Helper()
	stop, err := h.p.watchShared()
	if err != nil {
		t.Fatal(err)
	}
	h.p.cfg.Objects.Start()
	h.p.dyn.Start(h.ctx.Done())
	h.p.podFactory.Start(h.ctx.Done())
	t.Cleanup(func() {
		stop()
		h.cancel()
		h.p.podFactory.Shutdown()
		h.p.dyn.Shutdown()
	})
	if !cache.WaitForCacheSync(h.ctx.Done(), h.p.claims.HasSynced, h.p.classes.HasSynced, h.p.snapshots.HasSynced, h.p.contents.HasSynced,
		h.p.nodes.HasSynced, h.p.pods.HasSynced) {
		t.Fatal("informers did not sync")
	}
}

func (h *harness) annotations(t *testing.T, name string) map[string]string {
	t.Helper()
	c, err := h.client.CoreV1().PersistentVolumeClaims(ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Annotations
}

func (h *harness) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-h.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestDecide(t *testing.T) {
	roomy := fakeCapacity{"node-a": {"ssd": 5 * gi, "": 10 * gi}, "node-b": {"ssd": 50 * gi}}
	snapWorld := func(extra ...runtime.Object) world {
		return world{
			objs:     extra,
			dyn:      []runtime.Object{snapshot("snap", "content-1"), content("content-1", testDriver, snapHandle)},
			pvs:      fakePVs{},
			capacity: roomy,
		}
	}
	cloneWorld := func(extra ...runtime.Object) world {
		return world{
			objs:     append([]runtime.Object{claim("src", "thick", "1Gi", boundTo("pv-src"))}, extra...),
			pvs:      fakePVs{"pv-src": pv("pv-src", testDriver, "node-a")},
			capacity: roomy,
		}
	}
	tests := []struct {
		name  string
		world world
		claim string
		// result "" is no decision: no annotation, no Event.
		result, node, event string
		retry               bool
	}{
		{name: "restore placed on the snapshot's node",
			world: snapWorld(claim("c", "thick", "2Gi", fromSnapshot("snap"))),
			claim: "c", result: ResultPlaced, node: "node-a",
			event: `Normal PlacedWithSource Selected node node-a, where VolumeSnapshot app/snap lives: it has room for 2Gi in device class "ssd"`},
		{name: "restore by dataSource, default device class",
			world: snapWorld(claim("c", "default", "8Gi", fromSnapshotDataSource("snap"))),
			claim: "c", result: ResultPlaced, node: "node-a", event: "in its default device class"},
		{name: "restore of a pre-provisioned content (handle in spec)",
			world: world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
				dyn: []runtime.Object{snapshot("snap", "content-1"), func() *unstructured.Unstructured {
					u := content("content-1", testDriver, "")
					u.Object["spec"].(map[string]any)["source"] = map[string]any{"snapshotHandle": snapHandle}
					return u
				}()}, pvs: fakePVs{}, capacity: roomy},
			claim: "c", result: ResultPlaced, node: "node-a", event: "PlacedWithSource"},
		{name: "clone placed on the source's node",
			world: cloneWorld(claim("c", "thick", "1Gi", fromClaim("src"))),
			claim: "c", result: ResultPlaced, node: "node-a", event: "where PersistentVolumeClaim app/src lives"},
		{name: "source node full",
			world: snapWorld(claim("c", "thick", "6Gi", fromSnapshot("snap"))),
			claim: "c", result: ResultSourceNodeFull,
			event: `Normal NotPlaced SourceNodeFull: VolumeSnapshot app/snap lives on node node-a, which can make volumes of at most 5Gi in device class "ssd" (StorageClass thick); the claim asks 6Gi`},
		{name: "source node lacks the device class",
			world: world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
				dyn: snapWorld().dyn, pvs: fakePVs{}, capacity: fakeCapacity{"node-a": {"": 10 * gi}}},
			claim: "c", result: ResultSourceNodeFull, event: "at most 0 in"},
		{name: "source node unreachable",
			world: world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
				dyn: snapWorld().dyn, pvs: fakePVs{}, capacity: fakeCapacity{"node-b": {"ssd": gi}}},
			claim: "c", result: ResultSourceNodeUnreachable, retry: true, event: "SourceNodeUnreachable: VolumeSnapshot app/snap lives on node node-a"},
		{name: "snapshot missing",
			world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("nope"))),
			claim: "c", result: ResultSourceNodeUnknown, retry: true, event: "SourceNodeUnknown: VolumeSnapshot app/nope does not exist"},
		{name: "snapshot not bound to a content yet",
			world: world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
				dyn: []runtime.Object{snapshot("snap", "")}, pvs: fakePVs{}, capacity: roomy},
			claim: "c", result: ResultSourceNodeUnknown, retry: true, event: "not bound to a VolumeSnapshotContent yet"},
		{name: "content without a handle yet",
			world: world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
				dyn: []runtime.Object{snapshot("snap", "content-1"), content("content-1", testDriver, "")}, pvs: fakePVs{}, capacity: roomy},
			claim: "c", result: ResultSourceNodeUnknown, retry: true, event: "has no snapshot handle yet"},
		{name: "snapshot of another driver",
			world: world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
				dyn: []runtime.Object{snapshot("snap", "content-1"), content("content-1", "other.csi.example", "snap-1")}, pvs: fakePVs{}, capacity: roomy},
			claim: "c", result: ResultSourceNotCarve, event: `SourceNotCarve: VolumeSnapshot app/snap is not a volume of lvm.carve.dev (VolumeSnapshotContent content-1 is driver "other.csi.example"'s)`},
		{name: "carve content with a handle carve never made",
			world: world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
				dyn: []runtime.Object{snapshot("snap", "content-1"), content("content-1", testDriver, "garbage")}, pvs: fakePVs{}, capacity: roomy},
			claim: "c", result: ResultSourceNotCarve, event: "is not a carve snapshot ID"},
		{name: "clone source not bound yet",
			world: world{objs: []runtime.Object{claim("src", "thick", "1Gi"), claim("c", "thick", "1Gi", fromClaim("src"))},
				pvs: fakePVs{}, capacity: roomy},
			claim: "c", result: ResultSourceNodeUnknown, retry: true, event: "PersistentVolumeClaim app/src is not bound yet"},
		{name: "clone source PV not in the cache yet",
			world: world{objs: []runtime.Object{claim("src", "thick", "1Gi", boundTo("pv-src")), claim("c", "thick", "1Gi", fromClaim("src"))},
				pvs: nil, capacity: roomy},
			claim: "c", result: ResultSourceNodeUnknown, retry: true, event: "is not known yet"},
		{name: "clone of another driver's volume",
			world: world{objs: []runtime.Object{claim("src", "thick", "1Gi", boundTo("pv-src")), claim("c", "thick", "1Gi", fromClaim("src"))},
				pvs: fakePVs{"pv-src": pv("pv-src", "other.csi.example", "node-a")}, capacity: roomy},
			claim: "c", result: ResultSourceNotCarve, event: "PersistentVolume pv-src is another driver's"},
		{name: "placed before: the node refused, carve does not select it again",
			world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap"), annotated(AnnPlaced, "node-a"))),
			claim: "c", result: ResultPlacedBefore, event: "PlacedBefore: the claim carries carve.dev/placed-with-source=node-a"},

		{name: "the pod's nodeSelector excludes the source's node",
			world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")), pendingPod("pod-z", []string{"c"}, func(p *corev1.Pod) {
				p.Spec.NodeSelector = map[string]string{"zone": "z2"}
			})),
			claim: "c", result: ResultPodCannotRun,
			event: "Normal NotPlaced PodCannotRunThere: VolumeSnapshot app/snap lives on node node-a, where pod pod-z cannot run: its nodeSelector zone=z2 does not match the node's labels; the scheduler chooses the node"},
		{name: "the pod's required node affinity excludes the source's node",
			world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")), pendingPod("pod-z", []string{"c"}, func(p *corev1.Pod) {
				p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
						Key: testKey, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-a"}}}}}}}}
			})),
			claim: "c", result: ResultPodCannotRun, event: "where pod pod-z cannot run: its required node affinity"},
		{name: "the source's node has a taint the pod does not tolerate",
			world: func() world {
				w := snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")))
				w.nodes = []runtime.Object{testNode("node-a", func(n *corev1.Node) {
					n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
				})}
				return w
			}(),
			claim: "c", result: ResultPodCannotRun, event: "where pod pod-c cannot run: it does not tolerate the node's taint dedicated=gpu:NoSchedule"},
		{name: "a tainted source's node the pod tolerates",
			world: func() world {
				w := snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")), pendingPod("pod-z", []string{"c"}, func(p *corev1.Pod) {
					p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
				}))
				w.noPod = true
				w.nodes = []runtime.Object{testNode("node-a", func(n *corev1.Node) {
					n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
				})}
				return w
			}(),
			claim: "c", result: ResultPlaced, node: "node-a", event: "and the pods waiting for the claim (pod-z) can run there"},
		{name: "the source's node is not a Node",
			world: world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
				dyn: []runtime.Object{snapshot("snap", "content-1"), content("content-1", testDriver, volume.SnapshotID("node-z", "vg", volume.SnapshotLVNameFor("s")))},
				pvs: fakePVs{}, capacity: fakeCapacity{"node-z": {"ssd": 5 * gi}}},
			claim: "c", result: ResultPodCannotRun, event: "lives on node node-z, which is not a Node of the cluster"},
		{name: "the pod's other claim is bound to a volume on another node",
			world: func() world {
				w := snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")), claim("wal", "thick", "1Gi", boundTo("pv-wal")),
					pendingPod("pod-z", []string{"c", "wal"}))
				w.pvs = fakePVs{"pv-wal": pv("pv-wal", testDriver, "node-b")}
				return w
			}(),
			claim: "c", result: ResultPodCannotRun, event: "it also uses claim wal, whose PersistentVolume pv-wal's node affinity excludes the node"},
		{name: "the pod's other claim has another node selected",
			world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")), claim("wal", "thick", "1Gi", annotated(AnnSelectedNode, "node-b")),
				pendingPod("pod-z", []string{"c", "wal"})),
			claim: "c", result: ResultPodCannotRun, event: "it also uses claim wal, for which node node-b is selected"},
		{name: "the pod's other claim is on the source's node too",
			world: func() world {
				w := snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")), claim("data", "thick", "1Gi", boundTo("pv-data")),
					pendingPod("pod-z", []string{"c", "data"}))
				w.pvs = fakePVs{"pv-data": pv("pv-data", testDriver, "node-a")}
				return w
			}(),
			claim: "c", result: ResultPlaced, node: "node-a", event: "the pods waiting for the claim (pod-c, pod-z) can run there"},
		{name: "the pod does not fit the source's node's free CPU",
			world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")), func() *corev1.Pod {
				p := pendingPod("busy", nil, func(p *corev1.Pod) {
					p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3500m")}
				})
				p.Spec.NodeName, p.Status.Phase = "node-a", corev1.PodRunning
				return p
			}(), pendingPod("pod-z", []string{"c"}, func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
			})),
			claim: "c", result: ResultPodCannotRun, event: "where the claim's pods do not fit: insufficient cpu: the pod requests 1, the node has 4 allocatable of which 3500m is requested"},

		// Nothing for carve to decide: no annotation, no Event.
		{name: "no pod uses the claim yet", world: func() world {
			w := snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")))
			w.noPod = true
			return w
		}(), claim: "c"},
		{name: "the claim's only pod has a node already", world: func() world {
			w := snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap")), pendingPod("pod-c", []string{"c"}, func(p *corev1.Pod) {
				p.Spec.NodeName, p.Status.Phase = "node-b", corev1.PodRunning
			}))
			w.noPod = true
			return w
		}(), claim: "c"},
		{name: "node already selected", world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap"), annotated(AnnSelectedNode, "node-b"))), claim: "c"},
		{name: "bound", world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap"), boundTo("pv-1"))), claim: "c"},
		{name: "Immediate class", world: snapWorld(claim("c", "now", "1Gi", fromSnapshot("snap"))), claim: "c"},
		{name: "another driver's class", world: snapWorld(claim("c", "other", "1Gi", fromSnapshot("snap"))), claim: "c"},
		{name: "unknown class", world: snapWorld(claim("c", "gone", "1Gi", fromSnapshot("snap"))), claim: "c"},
		{name: "no source", world: snapWorld(claim("c", "thick", "1Gi")), claim: "c"},
		{name: "a populator source", world: snapWorld(claim("c", "thick", "1Gi", func(c *corev1.PersistentVolumeClaim) {
			g := "example.com"
			c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &g, Kind: "Thing", Name: "x"}
		})), claim: "c"},
		{name: "being deleted", world: snapWorld(claim("c", "thick", "1Gi", fromSnapshot("snap"), func(c *corev1.PersistentVolumeClaim) {
			now := metav1.Now()
			c.DeletionTimestamp = &now
			c.Finalizers = []string{"kubernetes.io/pvc-protection"}
		})), claim: "c"},
		{name: "claim gone", world: snapWorld(), claim: "c"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, tc.world)
			h.informers(t)
			var before map[string]string
			if _, err := h.client.CoreV1().PersistentVolumeClaims(ns).Get(h.ctx, tc.claim, metav1.GetOptions{}); err == nil {
				before = h.annotations(t, tc.claim)
			}
			out, err := h.p.sync(h.ctx, ns+"/"+tc.claim)
			if err != nil {
				t.Fatalf("sync: %v", err)
			}
			if out.result != tc.result || out.retry != tc.retry {
				t.Errorf("result %q retry %v (%s), want %q retry %v", out.result, out.retry, out.message, tc.result, tc.retry)
			}
			evs := h.drainEvents()
			switch {
			case tc.event == "" && len(evs) > 0:
				t.Errorf("events %q, want none", evs)
			case tc.event != "" && (len(evs) != 1 || !strings.Contains(evs[0], tc.event)):
				t.Errorf("events %q, want one containing %q", evs, tc.event)
			}
			for _, r := range results {
				want := 0.0
				if r == tc.result {
					want = 1
				}
				if got := testutil.ToFloat64(h.p.decisions.WithLabelValues(r)); got != want {
					t.Errorf("carve_restore_placements_total{result=%q} = %v, want %v", r, got, want)
				}
			}
			if before == nil {
				return
			}
			after := h.annotations(t, tc.claim)
			if tc.node != "" {
				if after[AnnSelectedNode] != tc.node || after[AnnPlaced] != tc.node {
					t.Errorf("annotations %v, want %s and %s = %s", after, AnnSelectedNode, AnnPlaced, tc.node)
				}
			} else if fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("annotations changed from %v to %v", before, after)
			}
		})
	}
}

// TestToldOnce: a claim looked at again with the same answer gets no
// second Event or count; a new answer gets its own.
func TestToldOnce(t *testing.T) {
	h := start(t, world{objs: []runtime.Object{claim("c", "thick", "1Gi", fromSnapshot("snap"))},
		dyn: []runtime.Object{snapshot("snap", "content-1"), content("content-1", testDriver, snapHandle)},
		pvs: fakePVs{}, capacity: fakeCapacity{}})
	h.informers(t)
	for range 3 {
		if out, err := h.p.sync(h.ctx, ns+"/c"); err != nil || out.result != ResultSourceNodeUnreachable {
			t.Fatalf("sync: %+v, %v", out, err)
		}
	}
	if evs := h.drainEvents(); len(evs) != 1 {
		t.Errorf("events %q, want one", evs)
	}
	h.p.cfg.Capacity = fakeCapacity{"node-a": {"ssd": gi}}
	if out, err := h.p.sync(h.ctx, ns+"/c"); err != nil || out.result != ResultPlaced {
		t.Fatalf("sync: %+v, %v", out, err)
	}
	if evs := h.drainEvents(); len(evs) != 1 || !strings.Contains(evs[0], ReasonPlaced) {
		t.Errorf("events %q, want one PlacedWithSource", evs)
	}
	if got := testutil.ToFloat64(h.p.decisions.WithLabelValues(ResultSourceNodeUnreachable)); got != 1 {
		t.Errorf("unreachable counted %v times, want 1", got)
	}
}

// queueRecorder records what is queued instead of queueing it.
type queueRecorder struct {
	workqueue.TypedRateLimitingInterface[string]
	now   []string
	after map[string]time.Duration
}

func (q *queueRecorder) Add(k string) { q.now = append(q.now, k) }
func (q *queueRecorder) AddAfter(k string, d time.Duration) {
	q.after[k] = d
}

// TestClaimUpdateAfterTakeBack: a claim whose selected node was just
// taken back (csi-provisioner's reschedule) is looked at only after
// takenBackDelay, so that carve's selection does not reach
// csi-provisioner's cache before csi-provisioner's own write of the
// claim, which would overwrite it; any other update is looked at at once.
func TestClaimUpdateAfterTakeBack(t *testing.T) {
	restore := func(opts ...claimOpt) *corev1.PersistentVolumeClaim {
		return claim("c", "thick", "1Gi", append([]claimOpt{fromSnapshot("snap")}, opts...)...)
	}
	for _, tc := range []struct {
		name       string
		old, new   *corev1.PersistentVolumeClaim
		now        []string
		afterDelay bool
	}{
		{name: "selection taken back", old: restore(annotated(AnnSelectedNode, "node-b")), new: restore(), afterDelay: true},
		{name: "other change, no selection", old: restore(), new: restore(annotated("x", "y")), now: []string{ns + "/c"}},
		{name: "node selected", old: restore(), new: restore(annotated(AnnSelectedNode, "node-b"))},
		{name: "taken back from a bound claim", old: restore(annotated(AnnSelectedNode, "node-b")), new: restore(boundTo("pv"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, world{pvs: fakePVs{}, capacity: fakeCapacity{}})
			// The claims' index, with no informer started: only the
			// handler's own queueing is looked at.
			stop, err := h.p.watchShared()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
			q := &queueRecorder{TypedRateLimitingInterface: h.p.queue, after: map[string]time.Duration{}}
			h.p.queue = q
			h.p.onClaimUpdate(tc.old, tc.new)
			if !slices.Equal(q.now, tc.now) {
				t.Errorf("queued at once %v, want %v", q.now, tc.now)
			}
			if d, ok := q.after[ns+"/c"]; ok != tc.afterDelay || (ok && d != takenBackDelay) {
				t.Errorf("queued after %v (%t), want after %v: %t", d, ok, takenBackDelay, tc.afterDelay)
			}
		})
	}
}

// TestRun: the workers place a restore created while they run once a
// pod that uses it waits (the pod's arrival looks at the claim again;
// before it nothing is decided), and a clone once its source is bound
// (the source's change looks at the clone again).
func TestRun(t *testing.T) {
	pvs := fakePVs{"pv-src": pv("pv-src", testDriver, "node-b")}
	h := start(t, world{objs: []runtime.Object{claim("src", "thick", "1Gi")},
		dyn: []runtime.Object{snapshot("snap", "content-1"), content("content-1", testDriver, snapHandle)},
		pvs: pvs, capacity: fakeCapacity{"node-a": {"ssd": gi}, "node-b": {"ssd": gi}}})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(h.ctx)
	go func() { done <- h.p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	pvcs := h.client.CoreV1().PersistentVolumeClaims(ns)
	for _, c := range []*corev1.PersistentVolumeClaim{claim("restore", "thick", "1Gi", fromSnapshot("snap")), claim("clone", "thick", "1Gi", fromClaim("src"))} {
		if _, err := pvcs.Create(h.ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitAnnotation := func(name, node string) {
		t.Helper()
		for {
			c, err := pvcs.Get(h.ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Annotations[AnnSelectedNode] == node {
				return
			}
			select {
			case <-h.ctx.Done():
				t.Fatalf("claim %s: annotations %v, want %s=%s", name, c.Annotations, AnnSelectedNode, node)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	time.Sleep(100 * time.Millisecond)
	if c, err := pvcs.Get(h.ctx, "restore", metav1.GetOptions{}); err != nil || c.Annotations[AnnSelectedNode] != "" {
		t.Fatalf("before its pod: claim restore %v (%v), want no selected node", c.Annotations, err)
	}
	for _, p := range []*corev1.Pod{pendingPod("restore-app", []string{"restore"}), pendingPod("clone-app", []string{"clone"})} {
		if _, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitAnnotation("restore", "node-a")
	src, err := pvcs.Get(h.ctx, "src", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	boundTo("pv-src")(src)
	if _, err := pvcs.Update(h.ctx, src, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAnnotation("clone", "node-b")
}

// TestWithoutSnapshotAPI: without the snapshot CRDs, clones are still
// placed, and a restore's node is unknown.
func TestWithoutSnapshotAPI(t *testing.T) {
	h := start(t, world{objs: []runtime.Object{claim("src", "thick", "1Gi", boundTo("pv-src")),
		claim("clone", "thick", "1Gi", fromClaim("src")), claim("restore", "thick", "1Gi", fromSnapshot("snap")),
		pendingPod("app", []string{"clone", "restore"})},
		pvs: fakePVs{"pv-src": pv("pv-src", testDriver, "node-a")}, capacity: fakeCapacity{"node-a": {"ssd": gi}}})
	h.client.Resources = nil
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(h.ctx)
	go func() { done <- h.p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var evs []string
	for len(evs) < 2 {
		select {
		case e := <-h.events.Events:
			evs = append(evs, e)
		case <-h.ctx.Done():
			t.Fatalf("events %q, want two", evs)
		}
	}
	slices.Sort(evs)
	if !strings.Contains(evs[0], "NotPlaced SourceNodeUnknown") || !strings.Contains(evs[0], "snapshot CRDs") ||
		!strings.Contains(evs[1], "PlacedWithSource Selected node node-a, where PersistentVolumeClaim app/src lives") {
		t.Errorf("events %q, want the clone placed and the restore's node unknown", evs)
	}
	if h.p.snapshots.HasSynced() {
		t.Error("the snapshot informers run without the snapshot API")
	}
}

func TestNew(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "Client") {
		t.Errorf("New of an empty config: %v", err)
	}
}
