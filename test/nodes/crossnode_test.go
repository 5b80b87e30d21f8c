//go:build nodes

package nodes

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"

	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
)

// peerName is the peer node of make test-nodes-peer (CARVE_NODES_PEER=1):
// a second node agent inside the guest, with a volume group of its own on
// real device-mapper and no kubelet (cluster.GuestPeerSpec).
const peerName = "peer-1"

// peersFromEnv are the peer nodes CARVE_NODES_PEER asks for (none by
// default: the other tests expect every unpinned pod on the guest). The
// shipped classes keep 1 GiB spare, the thin one inside its pool: a 2 GiB
// pool leaves the thin class room (TestCrossNodeDrain moves a thin claim),
// a 6 GiB volume group the thick class (make measure-move: 1 GiB).
func peersFromEnv() []cluster.GuestPeerSpec {
	if on, _ := strconv.ParseBool(os.Getenv("CARVE_NODES_PEER")); !on {
		return nil
	}
	return []cluster.GuestPeerSpec{{Name: peerName, VGSize: 6 << 30, PoolSize: "2g"}}
}

// peerMoveRetries is carve controller's --move-retries on a bed with a
// peer: a move whose catch-up cannot reach its source gives up after
// about 3 minutes (backoffs of 1, 2, 4 ... 32 s, then 60 s twice) rather
// than 35, so that TestCrossNodeMoveParksWhenTheSourceDies sees it park
// within the tier's time. The other moves' retries (a target agent
// started again, a source not yet unstaged) end well within that.
const peerMoveRetries = 8

// peerControllerArgs are the controller flags a bed with peers sets.
func peerControllerArgs(peers []cluster.GuestPeerSpec) []string {
	if len(peers) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("--move-retries=%d", peerMoveRetries)}
}

// peerNames lists the bed's peer nodes.
func peerNames(b *cluster.Cluster) string {
	var names []string
	for _, p := range b.GuestPeers {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

// needPeer returns the peer node. Only make test-nodes-peer starts it;
// make test-nodes leaves the tests that need it out (-skip), so a bed
// without it here is a failure, not a skip.
func needPeer(t *testing.T) *cluster.GuestPeer {
	t.Helper()
	p := bed.GuestPeer(peerName)
	if p == nil {
		t.Fatal("needs the peer node in the guest (CARVE_NODES_PEER=1; make test-nodes-peer)")
	}
	return p
}

// TestCrossNodeRestoreOnRealNodes (make test-nodes-peer): copies across
// nodes on the real control plane, with the real sidecars and real
// device-mapper on both ends. A pod on the guest node writes 32 MiB of
// random bytes to a thick ext4 claim and goes; a VolumeSnapshot of the
// claim is restored by a claim whose node is the peer (selected there, as
// the scheduler does for a pod pinned to it: no pod runs on the peer); the
// claim binds, its PV is the peer's and its LV holds, byte for byte, what
// the source's does. Then the other way: a clone of the restored claim,
// selected on the guest node, copied from the peer's agent, holds the
// same bytes, and a pod on the guest node reads the file back.
func TestCrossNodeRestoreOnRealNodes(t *testing.T) {
	peer := needPeer(t)
	ns := newNamespace(t, "crossnode")
	ctx := testCtx(t, 15*time.Minute)
	dc := dynamicClient(t)
	guest := bed.GuestNode(nodeName)
	const size = "64Mi"
	fileSum, sourceSum := crossNodeSource(t, ctx, dc, ns, thickSC, size, 32)

	group := "snapshot.storage.k8s.io"
	steps := []struct {
		claim, node string
		source      corev1.TypedObjectReference
	}{
		{"restored", peerName, corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}},
		{"back", nodeName, corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "restored"}},
	}
	for _, s := range steps {
		pvc := newPVC(ns, s.claim, thickSC, size)
		pvc.Annotations = map[string]string{placement.AnnSelectedNode: s.node}
		pvc.Spec.DataSourceRef = &s.source
		start := time.Now()
		if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pv := waitClaimBound(t, ns, s.claim, 5*time.Minute)
		took := time.Since(start)
		if got := pvNode(t, pv); got != s.node {
			t.Errorf("%s: PV %s is on node %s, want %s", s.claim, pv, got, s.node)
		}
		handle := volumeHandle(t, pv)
		if s.node == peerName && !strings.HasPrefix(handle, peer.VG+"/") {
			t.Errorf("%s: volume %s is not in the peer's volume group %s", s.claim, handle, peer.VG)
		}
		got, err := guest.SHA256OfLV(ctx, handle)
		if err != nil {
			t.Fatal(err)
		}
		if got != sourceSum {
			t.Errorf("%s (%s from %s): the LV %s on %s has SHA-256 %s, want the source's %s", s.claim, s.source.Kind, s.source.Name, handle, s.node, got, sourceSum)
		}
		t.Logf("%s: %s %s copied to node %s; claim Bound %s after it was created", s.claim, s.source.Kind, s.source.Name, s.node, took.Round(time.Millisecond))
	}

	reader := newPod(ns, "reader", "back", false, sleeper)
	reader.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": nodeName}
	if _, err := bed.Client.CoreV1().Pods(ns).Create(ctx, reader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodRunning(t, ns, "reader", "")
	if got := strings.Fields(podExec(t, ns, "reader", "sha256sum /data/f"))[0]; got != fileSum {
		t.Errorf("the file read back on %s after two copies across nodes has SHA-256 %s, want %s", nodeName, got, fileSum)
	}
}

// crossNodeSource makes, in ns, the source of a copy across nodes: a
// claim "data" of class sc and size on the guest node, to which a pod writes
// mib MiB of random bytes (/data/f) before it goes, and a ready
// VolumeSnapshot "snap" of it (deleted at cleanup). It returns the file's
// SHA-256 and the source LV's, which, unmounted, no longer changes: the
// snapshot's.
func crossNodeSource(t *testing.T, ctx context.Context, dc dynamic.Interface, ns, sc, size string, mib int) (fileSum, sourceSum string) {
	t.Helper()
	writer := newPod(ns, "writer", "data", false, sleeper)
	writer.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": nodeName}
	createClaimAndPod(t, newPVC(ns, "data", sc, size), writer)
	fileSum = strings.Fields(podExec(t, ns, "writer", fmt.Sprintf("head -c %d /dev/urandom > /data/f && sync && sha256sum /data/f", mib<<20)))[0]
	source := volumeHandle(t, pvOf(t, ns, "data"))
	deletePodWaitUnmounted(t, ns, "writer", source)
	sourceSum, err := bed.GuestNode(nodeName).SHA256OfLV(ctx, source)
	if err != nil {
		t.Fatal(err)
	}
	createSnapshotReady(t, ctx, dc, ns, "snap", "data")
	return fileSum, sourceSum
}

// TestCrossNodeRestoreSurvivesKillingThePeer (make test-nodes-peer): the
// peer's agent is killed (SIGKILL) in the middle of a restore onto the
// peer, as soon as its new LV exists tagged copy=pending, and started
// again at once. The controller enrolls the new agent, csi-provisioner's
// retry gets a new grant and the copy runs again: the claim binds, and its
// LV holds the source's bytes and no longer carries the tag.
func TestCrossNodeRestoreSurvivesKillingThePeer(t *testing.T) {
	peer := needPeer(t)
	ns := newNamespace(t, "crosskill")
	ctx := testCtx(t, 15*time.Minute)
	dc := dynamicClient(t)
	// A bigger source than TestCrossNodeRestoreOnRealNodes': a longer
	// copy to kill in the middle of.
	const size = "128Mi"
	_, sourceSum := crossNodeSource(t, ctx, dc, ns, thickSC, size, 96)

	group := "snapshot.storage.k8s.io"
	pvc := newPVC(ns, "restored", thickSC, size)
	pvc.Annotations = map[string]string{placement.AnnSelectedNode: peerName}
	pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
	start := time.Now()
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pending := fmt.Sprintf("lvs --noheadings -o lv_tags %s | grep -q %s", peer.VG, volume.TagCopyPending)
	if err := peer.KillAgentWhen(ctx, pending, 3*time.Minute); err != nil {
		t.Fatalf("%v; last events of the claim: %s", err, claimEvents(ctx, ns, "restored"))
	}
	killed := time.Since(start)
	if err := peer.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	checkRestoredOnPeer(t, ctx, ns, "restored", 5*time.Minute, sourceSum)
	t.Logf("the peer's agent killed %s after the claim was created, its new LV tagged copy=pending; the claim Bound %s after it was created", killed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// claimEvents are the last events of a claim, for a wait that fails.
func claimEvents(ctx context.Context, ns, claim string) string {
	evs, err := bed.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + claim})
	if err != nil {
		return err.Error()
	}
	var last []string
	for _, e := range evs.Items {
		last = append(last, e.Reason+": "+e.Message)
	}
	if len(last) > 3 {
		last = last[len(last)-3:]
	}
	return strings.Join(last, " | ")
}

// pvNode is the node a PV's node affinity names (carve's topology key).
func pvNode(t *testing.T, pv string) string {
	t.Helper()
	p, err := bed.Client.CoreV1().PersistentVolumes().Get(testCtx(t, time.Minute), pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeAffinity == nil || p.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range p.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == cluster.TopologyKey && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

// deletePodWaitUnmounted deletes a pod on the guest node and waits until
// it is gone and the LV of handle is mounted nowhere in the guest.
func deletePodWaitUnmounted(t *testing.T, ns, pod, handle string) {
	t.Helper()
	if err := bed.Client.CoreV1().Pods(ns).Delete(testCtx(t, time.Minute), pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podTimeout, "pod "+pod+" gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		return apierrors.IsNotFound(err), "pod still there", nil
	})
	lv := handle[strings.Index(handle, "/")+1:]
	waitFor(t, shortWait, "no mount of "+handle+" left", func(ctx context.Context) (bool, string, error) {
		mounts := strings.TrimSpace(guestExec(t, "grep -e "+lv+" -e "+strings.ReplaceAll(lv, "-", "--")+" /proc/self/mountinfo || true"))
		return mounts == "", "mounts: " + mounts, nil
	})
}

// TestCrossNodeRestoreSpansAControllerRestart (make test-nodes-peer): a
// restore onto the peer whose copy spans a restart of carve controller
// (every replica's pod deleted at once, csi-provisioner with them) and the
// new controller's enrollment of the peer. The peer's agent is stopped
// (SIGSTOP) as soon as its new LV is tagged copy=pending, so the copy
// cannot end before the restart; the controller pods are deleted and come
// back while it is stopped (the new controller cannot reach the peer, and
// must not move the claim off it: the claim records where its create was
// sent); then the agent runs on. The claim binds on the peer, its LV holds
// the source's bytes and no longer carries the tag, and no second LV of
// the claim is left on the guest node.
func TestCrossNodeRestoreSpansAControllerRestart(t *testing.T) {
	peer := needPeer(t)
	ns := newNamespace(t, "crossrestart")
	ctx := testCtx(t, 20*time.Minute)
	dc := dynamicClient(t)
	const size = "128Mi"
	_, sourceSum := crossNodeSource(t, ctx, dc, ns, thickSC, size, 96)
	// The LVs outside the peer's volume group: the guest node's.
	guestLVs := fmt.Sprintf("lvs --noheadings -o vg_name,lv_name | awk '$1 != %q' | sort", peer.VG)
	before := strings.TrimSpace(guestExec(t, guestLVs))

	group := "snapshot.storage.k8s.io"
	pvc := newPVC(ns, "restored", thickSC, size)
	pvc.Annotations = map[string]string{placement.AnnSelectedNode: peerName}
	pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pending := fmt.Sprintf("lvs --noheadings -o lv_tags %s | grep -q %s", peer.VG, volume.TagCopyPending)
	if err := peer.StopAgentWhen(ctx, pending, 3*time.Minute); err != nil {
		t.Fatalf("%v; last events of the claim: %s", err, claimEvents(ctx, ns, "restored"))
	}
	stopped := time.Now()
	continued := false
	t.Cleanup(func() {
		if !continued {
			if err := peer.ContinueAgent(context.WithoutCancel(ctx)); err != nil {
				t.Error(err)
			}
		}
	})

	selector := labels.Set{"app.kubernetes.io/name": "carve", "app.kubernetes.io/component": "controller"}.String()
	old, err := bed.Client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	gone := map[string]bool{}
	zero := int64(0)
	for _, p := range old.Items {
		gone[p.Name] = true
		if err := bed.Client.CoreV1().Pods(bed.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 6*time.Minute, "new controller pods running", func(ctx context.Context) (bool, string, error) {
		pods, err := bed.Client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, "", err
		}
		running := 0
		var state []string
		for i := range pods.Items {
			p := &pods.Items[i]
			if !gone[p.Name] && allRunning(p) {
				running++
			}
			state = append(state, p.Name+": "+podState(p))
		}
		return running == len(old.Items) && len(pods.Items) == len(old.Items), strings.Join(state, "; "), nil
	})
	// The new controller cannot enroll the stopped peer; once it has
	// given that up, csi-provisioner's retry of the create is answered
	// that an earlier attempt was sent there, and the claim stays.
	inDoubt := "an earlier attempt was sent to node " + peerName
	waitFor(t, 6*time.Minute, "csi-provisioner told that the claim stays on "+peerName, func(ctx context.Context) (bool, string, error) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "restored", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		if got := c.Annotations[placement.AnnSelectedNode]; got != peerName {
			return false, "", fmt.Errorf("while the peer was stopped the claim was sent back to the scheduler (selected node %q); last events: %s", got, claimEvents(ctx, ns, "restored"))
		}
		if got := c.Annotations[router.AnnCreateSentTo]; got != peerName {
			return false, "", fmt.Errorf("the claim records its create sent to %q, want %s", got, peerName)
		}
		evs, err := bed.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=restored"})
		if err != nil {
			return false, "", err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, inDoubt) {
				return true, "", nil
			}
		}
		return false, claimEvents(ctx, ns, "restored"), nil
	})
	if err := peer.ContinueAgent(ctx); err != nil {
		t.Fatal(err)
	}
	continued = true
	t.Logf("the peer's agent stopped mid-copy for %s, across the controller's restart", time.Since(stopped).Round(time.Second))

	checkRestoredOnPeer(t, ctx, ns, "restored", 10*time.Minute, sourceSum)
	if after := strings.TrimSpace(guestExec(t, guestLVs)); after != before {
		t.Errorf("the guest node's volume group changed during the restore: LVs before\n%s\nafter\n%s", before, after)
	}
}

// checkRestoredOnPeer waits until claim binds and checks that its PV is
// the peer's and its LV holds sourceSum, no longer tagged copy=pending.
func checkRestoredOnPeer(t *testing.T, ctx context.Context, ns, claim string, timeout time.Duration, sourceSum string) {
	t.Helper()
	pv := waitClaimBound(t, ns, claim, timeout)
	handle := volumeHandle(t, pv)
	if got := pvNode(t, pv); got != peerName {
		t.Errorf("PV %s is on node %s, want %s", pv, got, peerName)
	}
	if tags := strings.TrimSpace(guestExec(t, "lvs --noheadings -o lv_tags "+handle)); strings.Contains(tags, volume.TagCopyPending) {
		t.Errorf("the bound volume %s is still tagged %s (%s)", handle, volume.TagCopyPending, tags)
	}
	got, err := bed.GuestNode(nodeName).SHA256OfLV(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	if got != sourceSum {
		t.Errorf("the LV %s on %s has SHA-256 %s, want the source's %s", handle, peerName, got, sourceSum)
	}
}
