//go:build nodes

package nodes

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/carve-csi/carve/test/harness/kubetest"
)

// provisionerLease is csi-provisioner's lease: its driver name with every
// character a lease name may not hold made a dash.
const provisionerLease = "lvm-carve-dev"

// TestLeaderTakeover stops the controller replica that leads csi-provisioner
// dead (every process of its pod SIGSTOPped, as a hung or cut-off pod) and
// checks that a claim created right after is provisioned by the other
// replica, whose pod name becomes the lease's holder. It reports the time
// from the stop to the claim Bound. SIGKILL would not show a takeover: the
// kubelet restarts a killed container under the same pod name, which is
// the same leader identity, so it would resume its own lease.
func TestLeaderTakeover(t *testing.T) {
	ctx := testCtx(t, 10*time.Minute)
	pods, err := bed.Client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{"app.kubernetes.io/name": "carve", "app.kubernetes.io/component": "controller"}.String()})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("the controller Deployment runs %d pods, want its 2 replicas", len(pods.Items))
	}
	var leader *corev1.Pod
	waitFor(t, 2*time.Minute, "a csi-provisioner leader among the controller pods", func(ctx context.Context) (bool, string, error) {
		l, err := bed.Client.CoordinationV1().Leases(bed.Namespace).Get(ctx, provisionerLease, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "no lease yet", nil
		}
		if err != nil {
			return false, "", err
		}
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		for i := range pods.Items {
			if pods.Items[i].Name == holder && allRunning(&pods.Items[i]) {
				leader = &pods.Items[i]
				return true, "", nil
			}
		}
		return false, "lease held by " + holder, nil
	})

	pids := podPIDs(t, leader)
	guestExec(t, "kill -STOP "+pids)
	stopped := time.Now()
	t.Cleanup(func() {
		guestExec(t, "kill -CONT "+pids)
		// The thawed sidecars find their lease lost and exit; the kubelet
		// starts them again as followers.
		if err := waitCarveRunning(testCtx(t, 7*time.Minute), bed); err != nil {
			t.Errorf("after the thaw: %v", err)
		}
	})

	ns := newNamespace(t, "takeover")
	kubetest.CreateClaimAndPod(t, ctx, bed.Client, newPVC(ns, "data", thickSC, "64Mi"), newPod(ns, "app", "data", false, sleeper))
	var bound time.Duration
	waitFor(t, podTimeout, "the claim Bound", func(ctx context.Context) (bool, string, error) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		bound = time.Since(stopped)
		return c.Status.Phase == corev1.ClaimBound, string(c.Status.Phase), nil
	})
	waitPodRunning(t, ns, "app", "")
	waitPodRunning(t, ns, "app", "")
	l, err := bed.Client.CoordinationV1().Leases(bed.Namespace).Get(ctx, provisionerLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h == leader.Name {
		t.Errorf("csi-provisioner's lease is still held by the stopped pod %s", leader.Name)
	}
	t.Logf("MEASURE leader takeover: the leader pod %s stopped dead, a new claim Bound %.1f s later (provisioned by %s)",
		leader.Name, bound.Seconds(), *l.Spec.HolderIdentity)
}

// podPIDs returns, space separated, the guest's PIDs of every process in
// the pod's containers (found by the containers' IDs in /proc/*/cgroup).
func podPIDs(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	var ids []string
	for _, c := range p.Status.ContainerStatuses {
		_, id, ok := strings.Cut(c.ContainerID, "://")
		if !ok || id == "" {
			t.Fatalf("container %s of %s has no ID (%q)", c.Name, p.Name, c.ContainerID)
		}
		ids = append(ids, id)
	}
	// -s: a process that exits between the glob and grep's read is no
	// error; grep would otherwise print its name among the PIDs.
	script := fmt.Sprintf("grep -s -l -E '%s' /proc/[0-9]*/cgroup | cut -d/ -f3 | sort -n | tr '\\n' ' '", strings.Join(ids, "|"))
	out := strings.Fields(guestExec(t, script))
	for _, pid := range out {
		if _, err := strconv.Atoi(pid); err != nil {
			t.Fatalf("the guest listed %q among the PIDs of %s: %q", pid, p.Name, out)
		}
	}
	if len(out) < len(ids) {
		t.Fatalf("found %d processes for the %d containers of %s: %q", len(out), len(ids), p.Name, out)
	}
	return strings.Join(out, " ")
}
