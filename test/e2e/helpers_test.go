//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/topology/pinned"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

const (
	// thickSC is the shipped WaitForFirstConsumer StorageClass of the thick
	// device class.
	thickSC     = "carve-thick-ext4"
	thickClass  = "thick"
	annSelected = "volume.kubernetes.io/selected-node"
	// settle bounds the wait for anything that should follow an API change
	// within a few informer round trips.
	settle = 60 * time.Second
)

// testCtx is a context bounded by d and by the test's own deadline.
func testCtx(t *testing.T, d time.Duration) context.Context { return kubetest.Ctx(t, d) }

// waitFor polls cond every 250 ms until it holds, failing the test after
// timeout with what and cond's last status (and any process that died).
func waitFor(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	kubetest.Poll(t, 250*time.Millisecond, timeout, what, cond, func() {
		if aerr := bed.CheckAlive(); aerr != nil {
			t.Errorf("processes died: %v", aerr)
		}
	})
}

// newNamespace creates a namespace for one test and, at cleanup, deletes
// its pods and PVCs and waits until their PVs and LVs are gone, so the next
// test starts from the same free space.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	return kubetest.NewNamespace(t, bed.Client, prefix, namespaceCleanup)
}

// namespaceCleanup deletes pods with no grace period (no kubelet confirms)
// and waits up to 2 minutes for each step, reporting any process of the
// test bed that died.
var namespaceCleanup = kubetest.NamespaceCleanup{
	ForcePods: true,
	Wait:      2 * time.Minute,
	Interval:  250 * time.Millisecond,
	OnTimeout: func(t *testing.T) {
		if err := bed.CheckAlive(); err != nil {
			t.Errorf("processes died: %v", err)
		}
	},
}

// deleteNamespaceVolumes empties ns of its volumes and deletes it, as the
// cleanup of newNamespace does.
func deleteNamespaceVolumes(t *testing.T, ns string) {
	t.Helper()
	namespaceCleanup.DeleteNamespaceVolumes(t, bed.Client, ns)
}

// newPVC returns a PVC of size in storage class sc.
func newPVC(ns, name, sc, size string) *corev1.PersistentVolumeClaim {
	return cluster.NewPVC(ns, name, sc, size)
}

// newPod returns a pod that mounts claim.
func newPod(ns, name, claim string) *corev1.Pod { return cluster.NewPod(ns, name, claim) }

// createPVCAndPod creates both and returns the time just before.
func createPVCAndPod(t *testing.T, ctx context.Context, pvc *corev1.PersistentVolumeClaim, pod *corev1.Pod) time.Time {
	t.Helper()
	start := time.Now()
	kubetest.CreateClaimAndPod(t, ctx, bed.Client, pvc, pod)
	return start
}

// waitBound waits until the PVC is Bound and returns it.
func waitBound(t *testing.T, ns, name string, timeout time.Duration) *corev1.PersistentVolumeClaim {
	t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	waitFor(t, timeout, "PVC "+ns+"/"+name+" to be Bound", func(ctx context.Context) (bool, string, error) {
		var err error
		pvc, err = bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not created yet", nil
		}
		if err != nil {
			return false, "", err
		}
		return pvc.Status.Phase == corev1.ClaimBound, fmt.Sprintf("phase %s, selected node %q", pvc.Status.Phase, pvc.Annotations[annSelected]), nil
	})
	return pvc
}

// dataClaimWithPod creates claim "data" of size in thickSC and pod "app"
// that mounts it, waits up to bound for the claim to be Bound and up to
// settle for the pod to be bound to a node, and returns the claim and
// the node.
func dataClaimWithPod(t *testing.T, ctx context.Context, ns, size string, bound time.Duration) (*corev1.PersistentVolumeClaim, string) {
	t.Helper()
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, size), newPod(ns, "app", "data"))
	pvc := waitBound(t, ns, "data", bound)
	return pvc, waitPodNode(t, ns, "app", settle)
}

// getPV is PV name; a failed get fails t.
func getPV(t *testing.T, ctx context.Context, name string) *corev1.PersistentVolume {
	t.Helper()
	pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

// raiseClaim asks for claim ns/name to hold size bytes.
func raiseClaim(t *testing.T, ctx context.Context, ns, name string, size int64) {
	t.Helper()
	q := resource.NewQuantity(size, resource.BinarySI)
	patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":"%s"}}}}`, q)
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("raise claim %s/%s to %s: %v", ns, name, q, err)
	}
}

// waitPodNode waits until the pod is bound to a node and returns the node.
func waitPodNode(t *testing.T, ns, name string, timeout time.Duration) string {
	t.Helper()
	var node string
	waitFor(t, timeout, "pod "+ns+"/"+name+" to be bound to a node", func(ctx context.Context) (bool, string, error) {
		pod, err := bed.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "not created yet", nil
		}
		if err != nil {
			return false, "", err
		}
		node = pod.Spec.NodeName
		return node != "", podConditions(pod), nil
	})
	return node
}

func podConditions(pod *corev1.Pod) string {
	var parts []string
	for _, c := range pod.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s %s", c.Type, c.Status, c.Message))
	}
	return strings.Join(parts, "; ")
}

// events returns the events of one object.
func events(ctx context.Context, ns, kind, name string) ([]corev1.Event, error) {
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name}.String()
	list, err := bed.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// eventsWith returns the events of an object with reason whose message
// contains substr.
func eventsWith(ctx context.Context, ns, kind, name, reason, substr string) ([]corev1.Event, error) {
	evs, err := events(ctx, ns, kind, name)
	if err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, e := range evs {
		if e.Reason == reason && strings.Contains(e.Message, substr) {
			out = append(out, e)
		}
	}
	return out, nil
}

// capacityObject returns the CSIStorageCapacity of node and storage class
// (nil when there is none).
func capacityObject(ctx context.Context, node, sc string) (*storagev1.CSIStorageCapacity, error) {
	list, err := bed.Client.StorageV1().CSIStorageCapacities(bed.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var found *storagev1.CSIStorageCapacity
	for i := range list.Items {
		c := &list.Items[i]
		if c.StorageClassName != sc || c.NodeTopology == nil || c.NodeTopology.MatchLabels[cluster.TopologyKey] != node {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("two CSIStorageCapacity objects for node %s and class %s: %s and %s", node, sc, found.Name, c.Name)
		}
		found = c
	}
	return found, nil
}

// capacityBytes is the published capacity of node and class, -1 when no
// object exists.
func capacityBytes(ctx context.Context, node, sc string) (int64, error) {
	c, err := capacityObject(ctx, node, sc)
	if err != nil || c == nil || c.Capacity == nil {
		return -1, err
	}
	return c.Capacity.Value(), nil
}

// nodeCapacities reads the published capacity of class sc on every node.
func nodeCapacities(t *testing.T, ctx context.Context, sc string) map[string]int64 {
	t.Helper()
	caps := map[string]int64{}
	for _, n := range bed.Nodes {
		got, err := capacityBytes(ctx, n.Name, sc)
		if err != nil {
			t.Fatal(err)
		}
		caps[n.Name] = got
	}
	return caps
}

// waitCapacities waits until every node publishes exactly want[node] for
// class sc.
func waitCapacities(t *testing.T, timeout time.Duration, what, sc string, want map[string]int64) {
	t.Helper()
	waitFor(t, timeout, what, func(ctx context.Context) (bool, string, error) {
		var off []string
		for _, n := range bed.Nodes {
			got, err := capacityBytes(ctx, n.Name, sc)
			if err != nil {
				return false, "", err
			}
			if got != want[n.Name] {
				off = append(off, fmt.Sprintf("%s: %d, want %d", n.Name, got, want[n.Name]))
			}
		}
		return len(off) == 0, strings.Join(off, "; "), nil
	})
}

// expectedThickCapacity is what carve should publish for the shipped thick
// class on node n: VG free minus the spare, in whole extents.
func expectedThickCapacity(ctx context.Context, n *cluster.Node) (int64, error) {
	vg, err := n.LVM.VolumeGroup(ctx, n.VG.Name)
	if err != nil {
		return 0, err
	}
	class := shippedClass(thickClass)
	if class == nil {
		return 0, fmt.Errorf("the shipped device-class file has no class %q", thickClass)
	}
	spare := class.SpareBytes()
	if vg.Free <= spare {
		return 0, nil
	}
	avail := vg.Free - spare
	return int64(avail - avail%vg.ExtentSize), nil
}

func shippedClass(name string) *deviceclass.DeviceClass {
	for i := range bed.DeviceClasses.DeviceClasses {
		if bed.DeviceClasses.DeviceClasses[i].Name == name {
			return &bed.DeviceClasses.DeviceClasses[i]
		}
	}
	return nil
}

// waitCapacitySettled waits until every node's published thick capacity
// equals VG free minus spare, i.e. no refresh is pending.
func waitCapacitySettled(t *testing.T, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "published thick capacity to equal VG free - spare on every node", func(ctx context.Context) (bool, string, error) {
		var off []string
		for _, n := range bed.Nodes {
			want, err := expectedThickCapacity(ctx, n)
			if err != nil {
				return false, "", err
			}
			got, err := capacityBytes(ctx, n.Name, thickSC)
			if err != nil {
				return false, "", err
			}
			if got != want {
				off = append(off, fmt.Sprintf("%s published %d, VG says %d", n.Name, got, want))
			}
		}
		return len(off) == 0, strings.Join(off, "; "), nil
	})
}

// lvsByNode lists every LV of every node's volume group with carve's lvm
// package.
func lvsByNode(ctx context.Context) (map[string][]lvm.LogicalVolume, error) {
	out := map[string][]lvm.LogicalVolume{}
	for _, n := range bed.Nodes {
		lvs, err := n.LVM.ListLVs(ctx, n.VG.Name)
		if err != nil {
			return nil, fmt.Errorf("lvs of node %s: %w", n.Name, err)
		}
		out[n.Name] = lvs
	}
	return out, nil
}

// lvOfPV finds the LV of a PV in every node's VG and returns the nodes
// holding it, with the LV of the first.
func lvOfPV(ctx context.Context, pvName string) ([]string, *lvm.LogicalVolume, error) {
	all, err := lvsByNode(ctx)
	if err != nil {
		return nil, nil, err
	}
	var nodes []string
	var found *lvm.LogicalVolume
	for _, n := range bed.Nodes {
		for i, lv := range all[n.Name] {
			if lv.Name == volume.LVNameFor(pvName) || volume.HasVolumeName(lv.Tags, pvName) {
				nodes = append(nodes, n.Name)
				if found == nil {
					found = &all[n.Name][i]
				}
			}
		}
	}
	return nodes, found, nil
}

// checkVolumeOnNode asserts that the PVC's PV has node affinity for node,
// and that its LV exists in node's VG (and nowhere else) with the requested
// size and carve's tags, the claim's among them (the DaemonSet's
// csi-provisioner runs with --extra-create-metadata).
func checkVolumeOnNode(t *testing.T, ctx context.Context, pvc *corev1.PersistentVolumeClaim, node string) {
	t.Helper()
	pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get PV of %s: %v", pvc.Name, err)
	}
	if got := pvNode(pv); got != node {
		t.Errorf("PV %s node affinity names %q, want %q (%+v)", pv.Name, got, node, pv.Spec.NodeAffinity)
	}
	n := bed.Node(node)
	wantHandle := n.VG.Name + "/" + volume.LVNameFor(pv.Name)
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != cluster.DriverName || pv.Spec.CSI.VolumeHandle != wantHandle {
		t.Errorf("PV %s CSI source %+v, want driver %s and handle %s", pv.Name, pv.Spec.CSI, cluster.DriverName, wantHandle)
	}
	nodes, lv, err := lvOfPV(ctx, pv.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0] != node {
		t.Fatalf("LV of PV %s found on nodes %v, want exactly [%s]", pv.Name, nodes, node)
	}
	want := pvc.Spec.Resources.Requests.Storage().Value()
	if int64(lv.Size) != want {
		t.Errorf("LV %s/%s is %d bytes, PVC asked %d", lv.VolumeGroup, lv.Name, lv.Size, want)
	}
	for _, tag := range []string{volume.TagOwner, volume.VolumeTag(pv.Name), volume.TagClassPrefix + thickClass, volume.ClaimTag(pvc.Namespace, pvc.Name)} {
		if !slices.Contains(lv.Tags, tag) {
			t.Errorf("LV %s/%s tags %v lack %q", lv.VolumeGroup, lv.Name, lv.Tags, tag)
		}
	}
	if pvSize := pv.Spec.Capacity.Storage().Value(); pvSize != int64(lv.Size) {
		t.Errorf("PV %s capacity %d, LV size %d", pv.Name, pvSize, lv.Size)
	}
}

// pvNode is the node named by a PV's required node affinity on carve's
// topology key.
func pvNode(pv *corev1.PersistentVolume) string { return pinned.Node(pv, cluster.TopologyKey) }

// metricSum sums the samples of one metric whose labels contain every
// label="value" pair given, over every node's carve node.
func metricSum(ctx context.Context, name string, labels ...string) (float64, error) {
	var total float64
	for _, n := range bed.Nodes {
		v, err := scrape(ctx, n.MetricsURL, name, labels...)
		if err != nil {
			return 0, fmt.Errorf("metrics of node %s: %w", n.Name, err)
		}
		total += v
	}
	return total, nil
}

// scrape reads a Prometheus text endpoint and sums the matching samples.
func scrape(ctx context.Context, url, name string, labels ...string) (_ float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := resp.Body.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("GET %s: close body: %w", url, cerr)
		}
	}()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	var total float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
line:
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		for _, want := range labels {
			if !strings.Contains(l, want) {
				continue line
			}
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("sample %q: %w", l, err)
		}
		total += v
	}
	return total, sc.Err()
}

// createVolumeCalls counts CreateVolume calls on all nodes, from carve's own
// carve_phase_duration_seconds histogram.
func createVolumeCalls(ctx context.Context) (float64, error) {
	return metricSum(ctx, "carve_phase_duration_seconds_count", `phase="create"`)
}

func gib(n int64) int64 { return n << 30 }

// createClass creates a carve StorageClass of the device class with that
// binding mode, deleted when the test ends.
func createClass(t *testing.T, ctx context.Context, name, class string, mode storagev1.VolumeBindingMode) {
	t.Helper()
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name},
		Provisioner:       "lvm.carve.dev",
		Parameters:        map[string]string{volume.ParamDeviceClass: class},
		VolumeBindingMode: &mode,
	}
	if _, err := bed.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete StorageClass: %v", err)
		}
	})
}

// checkNoNewLVs fails the test unless every node holds as many LVs as in
// before (lvsByNode).
func checkNoNewLVs(t *testing.T, ctx context.Context, before map[string][]lvm.LogicalVolume) {
	t.Helper()
	after, err := lvsByNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range bed.Nodes {
		if len(after[n.Name]) != len(before[n.Name]) {
			t.Errorf("node %s had %d LVs, now %d", n.Name, len(before[n.Name]), len(after[n.Name]))
		}
	}
}
