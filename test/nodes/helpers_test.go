//go:build nodes

package nodes

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"

	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// Every pod of these tests runs on the one guest node, under TCG, where a
// container start takes seconds: the timeouts are generous on purpose and
// say nothing about speed (the figures are in docs/benchmarks.md).
//
// A test that touches only its own namespace's claims and pods calls
// t.Parallel(): Go runs those together once the others are done, and
// most of their time is waiting on the kubelet. The others need the node
// to themselves: the latency figures, the plugin kill, the reboot, and
// the capacity accounting of TestDeletingTheClaimRemovesTheLV.
const (
	podTimeout = 3 * time.Minute
	shortWait  = time.Minute
)

func testCtx(t *testing.T, d time.Duration) context.Context { return kubetest.Ctx(t, d) }

// waitFor polls cond every 500 ms until it holds, failing the test after
// timeout with what and cond's last status.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	kubetest.Poll(t, 500*time.Millisecond, timeout, what, cond, nil)
}

// notYet tells waitFor to ask again, showing err as the status.
func notYet(err error) (bool, string, error) { return false, err.Error(), nil }

// newStatefulSet is StatefulSet ns/name of one pod of spec, labeled
// app=name, with claims as its volume claim templates (claims with no
// namespace).
func newStatefulSet(ns, name string, spec corev1.PodSpec, claims ...corev1.PersistentVolumeClaim) *appsv1.StatefulSet {
	one := int32(1)
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       spec,
			},
			VolumeClaimTemplates: claims,
		},
	}
}

// dynamicClient is a dynamic client of the bed's API server (for the
// snapshot API).
func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	return kubetest.DynamicClient(t, bed.Control.Config)
}

// createSnapshotReady creates VolumeSnapshot ns/name of claim in
// snapshotClass, deleted when the test ends, and waits until it is
// ReadyToUse.
func createSnapshotReady(t *testing.T, ctx context.Context, dc dynamic.Interface, ns, name, claim string) {
	t.Helper()
	t.Cleanup(func() { deleteSnapshot(t, dc, ns, name) })
	if err := kubetest.CreateVolumeSnapshot(ctx, dc, ns, name, snapshotClass, claim); err != nil {
		t.Fatal(err)
	}
	waitSnapshotReady(t, dc, ns, name)
}

// waitSnapshotReady waits until the VolumeSnapshot ns/name is ReadyToUse
// and returns it as it was then (its status.restoreSize, say).
func waitSnapshotReady(t *testing.T, dc dynamic.Interface, ns, name string) *unstructured.Unstructured {
	t.Helper()
	var ready *unstructured.Unstructured
	waitFor(t, podTimeout, "the VolumeSnapshot "+ns+"/"+name+" ReadyToUse", func(ctx context.Context) (bool, string, error) {
		vs, err := dc.Resource(kubetest.VolumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		ok, _, _ := unstructured.NestedBool(vs.Object, "status", "readyToUse")
		if ok {
			ready = vs
		}
		status, _, _ := unstructured.NestedMap(vs.Object, "status")
		return ok, fmt.Sprintf("status %v", status), nil
	})
	return ready
}

// waitCarveRunning waits until the DaemonSet's pod on the guest node has
// every container running, the controller Deployment's pod too, and the
// kubelet has registered carve (the CSINode lists the driver).
func waitCarveRunning(ctx context.Context, bed *cluster.Cluster) error {
	deadline := time.Now().Add(6 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		if err := bed.CheckAlive(); err != nil {
			return fmt.Errorf("waiting for carve's pods: %w", err)
		}
		pods, err := bed.Client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: labels.Set{"app.kubernetes.io/name": "carve"}.String()})
		if err != nil {
			return err
		}
		running, total := 0, 0
		last = ""
		for _, p := range pods.Items {
			if simulated(bed, p.Spec.NodeName) {
				continue // no kubelet runs there
			}
			total++
			if allRunning(&p) {
				running++
			} else {
				last += fmt.Sprintf("%s: %s; ", p.Name, podState(&p))
			}
		}
		csiNode, err := bed.Client.StorageV1().CSINodes().Get(ctx, nodeName, metav1.GetOptions{})
		registered := err == nil && len(csiNode.Spec.Drivers) > 0
		if !registered {
			last += "CSINode without carve; "
		}
		published, err := capacityPublished(ctx, bed)
		if err != nil {
			return err
		}
		if published != "" {
			last += published + "; "
		}
		if running >= 2 && running == total && registered && published == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	return fmt.Errorf("carve's pods did not all run within 6 minutes: %s\n%s", last, carveState(ctx, bed))
}

// carveState says what the control plane made of carve's workloads: each
// DaemonSet's and Deployment's counts, where each pod is (an unscheduled
// pod's reason among them) and the namespace's last warnings. It is what
// a failed start needs to be understood from its report alone.
func carveState(ctx context.Context, bed *cluster.Cluster) string {
	var b strings.Builder
	if dss, err := bed.Client.AppsV1().DaemonSets(bed.Namespace).List(ctx, metav1.ListOptions{}); err != nil {
		fmt.Fprintf(&b, "DaemonSets: %v\n", err)
	} else {
		for _, ds := range dss.Items {
			fmt.Fprintf(&b, "DaemonSet %s: desired %d, scheduled %d, ready %d, misscheduled %d\n", ds.Name,
				ds.Status.DesiredNumberScheduled, ds.Status.CurrentNumberScheduled, ds.Status.NumberReady, ds.Status.NumberMisscheduled)
		}
	}
	if ds, err := bed.Client.AppsV1().Deployments(bed.Namespace).List(ctx, metav1.ListOptions{}); err != nil {
		fmt.Fprintf(&b, "Deployments: %v\n", err)
	} else {
		for _, d := range ds.Items {
			fmt.Fprintf(&b, "Deployment %s: replicas %d, ready %d\n", d.Name, d.Status.Replicas, d.Status.ReadyReplicas)
		}
	}
	if pods, err := bed.Client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{}); err != nil {
		fmt.Fprintf(&b, "pods: %v\n", err)
	} else {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s on %q: %s\n", p.Name, p.Spec.NodeName, podState(&p))
		}
	}
	if evs, err := bed.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"}); err != nil {
		fmt.Fprintf(&b, "events: %v\n", err)
	} else {
		items := evs.Items
		if len(items) > 10 {
			items = items[len(items)-10:]
		}
		for _, e := range items {
			fmt.Fprintf(&b, "event %s/%s %s: %s (x%d)\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message, e.Count)
		}
	}
	if n, err := bed.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err != nil {
		fmt.Fprintf(&b, "node %s: %v\n", nodeName, err)
	} else {
		fmt.Fprintf(&b, "node %s: taints %v, unschedulable %v\n", nodeName, n.Spec.Taints, n.Spec.Unschedulable)
	}
	return b.String()
}

// capacityPublished says which of the guest node and the peers has no
// CSIStorageCapacity yet, "" when each has one: the controller publishes
// a node's capacity once it reaches that node's agent, and a test that
// starts before would see its first CreateVolume refused as unreachable
// (and its claim sent back to the scheduler).
func capacityPublished(ctx context.Context, bed *cluster.Cluster) (string, error) {
	caps, err := bed.Client.StorageV1().CSIStorageCapacities(bed.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	var missing []string
	nodes := []string{nodeName}
	for _, p := range bed.GuestPeers {
		nodes = append(nodes, p.Name)
	}
	for _, n := range nodes {
		if !slices.ContainsFunc(caps.Items, func(c storagev1.CSIStorageCapacity) bool {
			return c.NodeTopology != nil && c.NodeTopology.MatchLabels[topology.Key] == n
		}) {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return "", nil
	}
	return "no CSIStorageCapacity yet for " + strings.Join(missing, ", "), nil
}

// simulated says whether node is one of the bed's simulated nodes or
// peers (no kubelet runs on either).
func simulated(bed *cluster.Cluster, node string) bool {
	return slices.ContainsFunc(bed.Nodes, func(n *cluster.Node) bool { return n.Name == node }) || bed.GuestPeer(node) != nil
}

func allRunning(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != len(p.Spec.Containers) {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return true
}

// podState says where a pod is: its phase, each waiting container's
// reason and the last words of a container that exited.
func podState(p *corev1.Pod) string {
	s := string(p.Status.Phase)
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			s += fmt.Sprintf(" %s:%s(%s)", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message)
		case c.State.Terminated != nil:
			s += fmt.Sprintf(" %s:terminated(%s %d)", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode)
		}
		// A crash-looping container's last exit carries its last log lines
		// (terminationMessagePolicy FallbackToLogsOnError): the only trace
		// of it outside the guest.
		if last := c.LastTerminationState.Terminated; last != nil && last.Message != "" {
			s += fmt.Sprintf(" %s:last-exit(%d %q)", c.Name, last.ExitCode, last.Message)
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue && cond.Message != "" {
			s += fmt.Sprintf(" %s:%s", cond.Type, cond.Message)
		}
	}
	return s
}

// newNamespace creates a namespace for one test and, at cleanup, deletes
// its StatefulSets, pods and PVCs and waits until their PVs are gone, so
// the next test finds the node's space as it was. The kubelet tears the
// pods down (unpublish, unstage) before their claims go.
func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	return kubetest.NewNamespace(t, bed.Client, prefix, kubetest.NamespaceCleanup{Wait: 4 * time.Minute, Interval: time.Second})
}

// newPVC returns a ReadWriteOnce claim of size in storage class sc.
func newPVC(ns, name, sc, size string) *corev1.PersistentVolumeClaim {
	return cluster.NewPVC(ns, name, sc, size)
}

// newPod is a pod of carve's image that mounts claim at /data (or, for a
// block claim, exposes it at /dev/xvda) and runs script.
func newPod(ns, name, claim string, block bool, script string) *corev1.Pod {
	zero := int64(0)
	c := corev1.Container{
		Name:            "app",
		Image:           carveImage,
		ImagePullPolicy: corev1.PullNever,
		Command:         []string{"/bin/sh", "-c", script},
	}
	if block {
		c.VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	} else {
		c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &zero,
			Containers:                    []corev1.Container{c},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}

// sleeper keeps a container running until it is killed.
const sleeper = "exec sleep 100000"

// createClaimAndPod creates both and waits until the pod runs.
func createClaimAndPod(t *testing.T, pvc *corev1.PersistentVolumeClaim, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	kubetest.CreateClaimAndPod(t, testCtx(t, time.Minute), bed.Client, pvc, pod)
	return waitPodRunning(t, pod.Namespace, pod.Name, "")
}

// createPod creates pod (its claim exists) and waits until it runs.
func createPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := bed.Client.CoreV1().Pods(pod.Namespace).Create(testCtx(t, time.Minute), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return waitPodRunning(t, pod.Namespace, pod.Name, "")
}

// waitPodRunning waits until the pod (a new one, when notUID is set: not
// the pod of that UID) runs all its containers, and returns it.
func waitPodRunning(t *testing.T, ns, name string, notUID string) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	waitFor(t, podTimeout, fmt.Sprintf("pod %s/%s running", ns, name), func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "no pod yet", nil
		}
		if err != nil {
			return false, "", err
		}
		if string(p.UID) == notUID {
			return false, "still the old pod", nil
		}
		got = p
		return allRunning(p), podState(p), nil
	})
	return got
}

// podExec runs a command in the pod's first container through the
// apiserver (kubectl exec, so the kubelet's streaming path is the real
// one) and returns its stdout.
func podExec(t *testing.T, ns, pod string, script string) string {
	t.Helper()
	out, err := kubectl(testCtx(t, time.Minute), "exec", "-n", ns, pod, "--", "/bin/sh", "-c", script)
	if err != nil {
		t.Fatalf("exec in %s/%s: %v", ns, pod, err)
	}
	return out
}

func kubectl(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{"--kubeconfig", bed.Control.Kubeconfig}, args...)
	out, err := exec.CommandContext(ctx, filepath.Join(bed.Config.BinDir, "kubectl"), argv...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return "", fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// guestExec runs a script on the guest node (as root, outside any
// container).
func guestExec(t *testing.T, script string) string {
	t.Helper()
	out, err := bed.GuestNode(nodeName).Exec(testCtx(t, 2*time.Minute), script)
	if err != nil {
		t.Fatalf("on the guest node: %v", err)
	}
	return out
}

// carvePod returns the DaemonSet's pod on the guest node.
func carvePod(t *testing.T, ctx context.Context) *corev1.Pod {
	t.Helper()
	pods, err := bed.Client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{"app.kubernetes.io/component": "node"}.String(),
		FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("carve's node pod on %s: %v (%d pods)", nodeName, err, len(pods.Items))
	}
	return &pods.Items[0]
}

func containerStatus(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// waitClaimBound waits until the claim is Bound and returns its PV.
func waitClaimBound(t *testing.T, ns, claim string, timeout time.Duration) string {
	t.Helper()
	var pv string
	waitFor(t, timeout, "PVC "+claim+" Bound", func(ctx context.Context) (bool, string, error) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		pv = c.Spec.VolumeName
		return c.Status.Phase == corev1.ClaimBound, fmt.Sprintf("%s; last events: %s", c.Status.Phase, claimEvents(ctx, ns, claim)), nil
	})
	return pv
}

// pvOf returns the name of the PV bound to the claim, waiting for it
// (a minute at most).
func pvOf(t *testing.T, ns, claim string) string {
	t.Helper()
	return waitClaimBound(t, ns, claim, shortWait)
}
