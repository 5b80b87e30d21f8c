//go:build nodes

package nodes

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/controller/mover"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// The moved StatefulSet: one replica of carve's image that only sleeps
// (the test writes through kubectl exec), its thick ext4 claim of
// moveSize() from the template, moveFileMiB MiB of random bytes in /data/f.
const (
	moveSet     = "db"
	movePod     = moveSet + "-0"
	moveClaim   = "data-" + movePod
	moveFileMiB = 64
	// moveWriter appends 64 KiB of random bytes to /data/log ten times a
	// second, 10 MiB in all (the figure: 10 MiB changed during
	// the first copy, which takes longer than its 16 s): what the
	// catch-up sends.
	moveWriter = "i=0; while [ $i -lt 160 ]; do head -c 65536 /dev/urandom >> /data/log; i=$((i+1)); sleep 0.1; done; sync"
)

// moveSize is the moved claim's size: CARVE_MOVE_SIZE (make
// measure-move sets it), else 256Mi.
func moveSize() string {
	if v := os.Getenv("CARVE_MOVE_SIZE"); v != "" {
		return v
	}
	return "256Mi"
}

// TestCrossNodeMoveStatefulSet (make test-nodes-peer): `kubectl carve
// move` (bin/kubectl-carve through the bed's kubeconfig) moves the claim
// of a StatefulSet's pod from the guest node to the peer while the pod
// appends to a file, then back. The first pod lands on the guest node
// (the peer cordoned while it is made). Each way: the claim, under its
// name, ends Bound to the mover's PV on the target node, whose LV is in
// that node's volume group; the old PV, the old LV and the seed snapshot
// are gone; no PV but the mover's was ever made for the namespace (a
// StatefulSet makes its deleted claim again at once: nothing may
// provision it). To the peer: the peer's LV has, byte for byte, what the
// source LV held once the pod stopped (read in the guest as soon as the
// source is closed: after that only the catch-up reads it). The new pod is
// scheduled to the peer, where it never runs; back: the test deletes the
// peer's pods at once when the claim is being deleted (the absent
// kubelet's part), and the pod runs on the guest node again and reads
// the files as the peer's LV holds them. MEASURE lines: the time from the
// request to the pod Ready, the downtime (claim being deleted to pod
// Ready; to the peer: to the claim Bound), the catch-up's bytes and the
// phases (the Event Moved). CARVE_MEASURE_ROUNDS rounds (default 1).
func TestCrossNodeMoveStatefulSet(t *testing.T) {
	peer := needPeer(t)
	rounds := kubetest.Rounds(t, 1)
	ctx := testCtx(t, 5*time.Minute+time.Duration(rounds)*15*time.Minute)
	ns, pvs, fileSum := moveSetUp(t, ctx, "move")
	wantPVs := []string{pvOf(t, ns, moveClaim)}

	var totals, downs []time.Duration
	for r := 1; r <= rounds; r++ {
		// To the peer, while the pod appends.
		oldPV := pvOf(t, ns, moveClaim)
		source := volumeHandle(t, oldPV)
		stopWriter := startWriter(t, ctx, ns)
		closedSum := sumWhenClosed(ctx, source)
		out, st := runMove(t, ctx, ns, moveClaim, peerName, oldPV)
		stopWriter()
		if st.err != nil {
			t.Fatalf("round %d: kubectl carve move to %s: %v\n%s", r, peerName, st.err, out)
		}
		target := checkMoved(t, ctx, ns, moveClaim, oldPV, source, peerName, peer.VG, st.seed)
		wantPVs = append(wantPVs, target)
		sum := <-closedSum
		if sum.err != nil {
			t.Fatalf("round %d: the source LV %s once closed: %v", r, source, sum.err)
		}
		handle := volumeHandle(t, target)
		got, err := bed.GuestNode(nodeName).SHA256OfLV(ctx, handle)
		if err != nil {
			t.Fatal(err)
		}
		if got != sum.sum {
			t.Errorf("round %d: the LV %s on %s has SHA-256 %s, want the source's %s once its pod stopped", r, handle, peerName, got, sum.sum)
		}
		waitPodScheduled(t, ns, movePod, peerName)
		files := filesOnLV(t, ctx, handle)
		if !strings.Contains(files, fileSum+"  ") {
			t.Errorf("round %d: /data/f on the peer's LV: %q, want SHA-256 %s", r, files, fileSum)
		}
		if st.stopped.IsZero() {
			t.Fatalf("round %d: the claim was never seen being deleted", r)
		}
		t.Logf("MEASURE move round %d to %s: claim being deleted to Bound %s (downtime with a pod that could start), request to moved %s; %s",
			r, peerName, st.bound.Sub(st.stopped).Round(time.Millisecond), st.moved.Sub(st.asked).Round(time.Millisecond), st.event)

		// Back to the guest node: the pod on the peer never runs, and
		// only a forced delete (the test's, as the kubelet) ends it.
		out, st = runMove(t, ctx, ns, moveClaim, nodeName, target)
		if st.err != nil {
			t.Fatalf("round %d: kubectl carve move to %s: %v\n%s", r, nodeName, st.err, out)
		}
		back := checkMoved(t, ctx, ns, moveClaim, target, handle, nodeName, "carve", st.seed)
		wantPVs = append(wantPVs, back)
		pod := waitPodReady(t, ctx, ns, movePod, nodeName, podTimeout)
		ready := st.ready
		if ready.IsZero() {
			ready = time.Now()
		}
		if st.stopped.IsZero() {
			t.Fatalf("round %d: the claim was never seen being deleted", r)
		}
		if again := podExec(t, ns, movePod, "cd /data && sha256sum f log"); again != strings.TrimSpace(files) {
			t.Errorf("round %d: back on %s the pod reads\n%s\nwant what the peer's LV held\n%s", r, pod.Spec.NodeName, again, files)
		}
		total, down := ready.Sub(st.asked), ready.Sub(st.stopped)
		totals, downs = append(totals, total), append(downs, down)
		t.Logf("MEASURE move round %d to %s (%s): request to pod Ready %s, downtime (claim being deleted to pod Ready) %s; %s",
			r, nodeName, moveSize(), total.Round(time.Millisecond), down.Round(time.Millisecond), st.event)
	}
	t.Logf("MEASURE move %s thick ext4 back to the node with a kubelet, %d rounds: request to pod Ready median %s, downtime median %s",
		moveSize(), rounds, kubetest.Percentile(totals, 50), kubetest.Percentile(downs, 50))

	made := pvs.names()
	if !slices.Equal(made, wantPVs) {
		t.Errorf("PVs made for namespace %s: %v, want only the first and the mover's: %v", ns, made, wantPVs)
	}
	claims, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != 1 || claims.Items[0].Name != moveClaim {
		t.Errorf("claims in %s: %d, want only %s", ns, len(claims.Items), moveClaim)
	}
}

// moveSetUp makes, in a new namespace, the moved StatefulSet with its
// first pod on the guest node and writes /data/f. It returns the
// namespace, the watch of the PVs made for it and /data/f's SHA-256.
func moveSetUp(t *testing.T, ctx context.Context, prefix string) (string, *pvWatch, string) {
	t.Helper()
	ns, pvs := startMovedSets(t, ctx, prefix, moveStatefulSet)
	fileSum := strings.Fields(podExec(t, ns, movePod, fmt.Sprintf("head -c %d /dev/urandom > /data/f && sync && sha256sum /data/f", moveFileMiB<<20)))[0]
	return ns, pvs, fileSum
}

// startMovedSets makes, in a new namespace, the StatefulSets sets make
// for it (one replica each), each with its pod ready on the guest node:
// the peer is cordoned meanwhile. It returns the namespace and the watch
// of the PVs made for it.
func startMovedSets(t *testing.T, ctx context.Context, prefix string, sets ...func(ns string) *appsv1.StatefulSet) (string, *pvWatch) {
	t.Helper()
	ns := newNamespace(t, prefix)
	pvs := watchPVs(t, ctx, ns)
	var made []*appsv1.StatefulSet
	for _, set := range sets {
		made = append(made, set(ns))
	}
	// Runs before the namespace's cleanup: a pod left on the peer (the
	// test failed there) would never end, nor would its claim.
	t.Cleanup(func() {
		ctx := context.Background()
		orphan := metav1.DeletePropagationOrphan
		for _, set := range made {
			if err := bed.Client.AppsV1().StatefulSets(ns).Delete(ctx, set.Name, metav1.DeleteOptions{PropagationPolicy: &orphan}); err != nil && !apierrors.IsNotFound(err) {
				t.Log(err)
			}
		}
		if _, err := cluster.ForceDeletePodsOn(ctx, bed.Client, peerName); err != nil {
			t.Log(err)
		}
	})
	cordon(t, ctx, peerName, true)
	t.Cleanup(func() { cordon(t, context.Background(), peerName, false) })
	for _, set := range made {
		if _, err := bed.Client.AppsV1().StatefulSets(ns).Create(ctx, set, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, set := range made {
		if pod := waitPodReady(t, ctx, ns, set.Name+"-0", "", 5*time.Minute); pod.Spec.NodeName != nodeName {
			t.Fatalf("the StatefulSet %s's first pod is on %s, want %s", set.Name, pod.Spec.NodeName, nodeName)
		}
	}
	cordon(t, ctx, peerName, false)
	return ns, pvs
}

// startWriter starts moveWriter in the pod (kubectl exec) and waits until
// it appended; it runs until the pod goes or the returned func is called.
func startWriter(t *testing.T, ctx context.Context, ns string) context.CancelFunc {
	t.Helper()
	writer, stop := context.WithCancel(ctx)
	go func() { _, _ = kubectl(writer, "exec", "-n", ns, movePod, "--", "/bin/sh", "-c", moveWriter) }()
	waitFor(t, shortWait, "the writer appending", func(ctx context.Context) (bool, string, error) {
		out, err := kubectl(ctx, "exec", "-n", ns, movePod, "--", "/bin/sh", "-c", "stat -c %s /data/log 2>/dev/null || echo 0")
		return err == nil && out != "0", out, nil
	})
	return stop
}

// TestCrossNodeMoveSurvivesKillingThePeer (make test-nodes-peer): the
// peer's agent, the target of a move, is killed (SIGKILL) during the
// catch-up: as soon as the source is closed (its pod stopped) and the
// target LV is tagged copy=pending; it is started again at once. The move
// ends: the claim is bound to the mover's PV on the peer, whose LV no
// longer carries the tag and holds, byte for byte, what the source held
// once closed.
func TestCrossNodeMoveSurvivesKillingThePeer(t *testing.T) {
	peer := needPeer(t)
	ctx := testCtx(t, 15*time.Minute)
	ns, _, _ := moveSetUp(t, ctx, "movekill")
	oldPV := pvOf(t, ns, moveClaim)
	source := volumeHandle(t, oldPV)
	stopWriter := startWriter(t, ctx, ns)
	defer stopWriter()
	closedSum := sumWhenClosed(ctx, source)
	cond := fmt.Sprintf(`lvs --noheadings -o lv_tags %s | grep -q %s && [ -z "$(lvs --noheadings -o lv_device_open %s | tr -d ' ')" ]`,
		peer.VG, volume.TagCopyPending, source)
	killed := make(chan error, 1)
	go func() {
		err := peer.KillAgentWhen(ctx, cond, 5*time.Minute)
		if err == nil {
			err = peer.StartAgent(ctx)
		}
		killed <- err
	}()
	out, st := runMove(t, ctx, ns, moveClaim, peerName, oldPV)
	if err := <-killed; err != nil {
		t.Fatalf("%v; kubectl carve move said:\n%s", err, out)
	}
	if st.err != nil {
		t.Fatalf("kubectl carve move to %s: %v\n%s", peerName, st.err, out)
	}
	target := checkMoved(t, ctx, ns, moveClaim, oldPV, source, peerName, peer.VG, st.seed)
	handle := volumeHandle(t, target)
	if tags := strings.TrimSpace(guestExec(t, "lvs --noheadings -o lv_tags "+handle)); strings.Contains(tags, volume.TagCopyPending) {
		t.Errorf("the moved volume %s is still tagged %s (%s)", handle, volume.TagCopyPending, tags)
	}
	sum := <-closedSum
	if sum.err != nil {
		t.Fatalf("the source LV %s once closed: %v", source, sum.err)
	}
	got, err := bed.GuestNode(nodeName).SHA256OfLV(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	if got != sum.sum {
		t.Errorf("the LV %s on %s has SHA-256 %s after the kill, want the source's %s once its pod stopped", handle, peerName, got, sum.sum)
	}
	t.Logf("the peer's agent killed during the catch-up and started again; moved: %s", st.event)
}

// TestCrossNodeMoveParksWhenTheSourceDies (make test-nodes-peer): the
// move's source node is lost for good. The claim is first moved to the
// peer (the node whose agent the test ends) while its pod appends to
// /data/log, then back to the guest
// node, the peer cordoned as a failing node is. While the move back
// stops the workload (the claim being deleted, held by a finalizer of
// the test's as by a pod still terminating), the test reads the SHA-256 of the seed snapshot on
// the peer and of the target on the guest node, then kills the peer's
// agent for good and removes its volume group, and only then deletes
// the pod (the absent kubelet's part): every catch-up finds its source
// gone. When the catch-up gives up (carve controller's --move-retries,
// peerMoveRetries here: where a rollback began before moves parked),
// the move parks: phase parked from catching-up, a MoveParked Event,
// kubectl carve move exits non-zero saying so; for a full parked poll
// after (the mover looks again at once and then every 30 s), the target
// LV stays in the guest's volume group with the seed's bytes, not
// copy-pending, the seed stays recorded, the claim stays unbound and no
// MoveRolledBack Event comes. Then `kubectl carve move --salvage` says
// which writes are lost (from the seed's time to the stop, as recorded),
// the claim binds to the mover's PV on the target, the old PV goes, a
// MoveSalvaged Event names the loss, and the StatefulSet's pod runs on
// the guest node and reads the files the source held.
func TestCrossNodeMoveParksWhenTheSourceDies(t *testing.T) {
	peer := needPeer(t)
	ctx := testCtx(t, 25*time.Minute)
	ns, _, _ := moveSetUp(t, ctx, "movelost")

	// To the peer first: its agent is the one the test can end.
	firstPV := pvOf(t, ns, moveClaim)
	firstHandle := volumeHandle(t, firstPV)
	stopWriter := startWriter(t, ctx, ns)
	out, st := runMove(t, ctx, ns, moveClaim, peerName, firstPV)
	stopWriter()
	if st.err != nil {
		t.Fatalf("kubectl carve move to %s: %v\n%s", peerName, st.err, out)
	}
	oldPV := checkMoved(t, ctx, ns, moveClaim, firstPV, firstHandle, peerName, peer.VG, st.seed)
	source := volumeHandle(t, oldPV)
	files := filesOnLV(t, ctx, source)
	// The pod on the peer holds the claim while the move back stops it:
	// the test chooses when the catch-up may begin.
	waitPodScheduled(t, ns, movePod, peerName)
	cordon(t, ctx, peerName, true)
	// A pod ends at once on the peer (its grace period is 0), so the
	// test's own finalizer holds the claim while the workload stops, as
	// a pod still terminating would: the catch-up begins only once the
	// test lets the claim go.
	release := holdClaim(t, ctx, ns, moveClaim)

	// Back to the guest node.
	moveOut, done := startMove(t, ctx, ns, moveClaim, nodeName, "20m")
	phaseOf := func(ctx context.Context) (*corev1.PersistentVolume, string, error) {
		pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, oldPV, metav1.GetOptions{})
		if err != nil {
			return nil, "", err
		}
		return pv, pv.Annotations[moveapi.AnnPhase], nil
	}
	var pv *corev1.PersistentVolume
	waitFor(t, 10*time.Minute, "the move back stopping the workload", func(ctx context.Context) (bool, string, error) {
		select {
		case err := <-done:
			return false, "", fmt.Errorf("kubectl carve move ended before the workload stopped: %w\n%s", err, moveOut.String())
		default:
		}
		p, phase, err := phaseOf(ctx)
		if err != nil {
			return false, "", err
		}
		if phase != "" && phase != moveapi.PhaseSeeding && phase != moveapi.PhaseStopping {
			return false, "", fmt.Errorf("the move is in phase %s before the test ended the source: %v", phase, p.Annotations)
		}
		pv = p
		return phase == moveapi.PhaseStopping, "phase " + phase, nil
	})
	seed, target := pv.Annotations[moveapi.AnnSeed], pv.Annotations[moveapi.AnnTargetID]
	_, seedVG, seedLV, err := volume.ParseSnapshotID(seed)
	if err != nil {
		t.Fatalf("the seed %q: %v", seed, err)
	}
	if seedVG != peer.VG || !strings.HasPrefix(target, "carve/") {
		t.Fatalf("the seed %s is not in %s's volume group %s, or the target %s not in %s's carve", seed, peerName, peer.VG, target, nodeName)
	}
	guest := bed.GuestNode(nodeName)
	seedSum, err := guest.SHA256OfLV(ctx, seedVG+"/"+seedLV)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := guest.SHA256OfLV(ctx, target); err != nil || got != seedSum {
		t.Fatalf("the target %s has SHA-256 %s (%v) once seeded, want the seed's %s", target, got, err, seedSum)
	}

	// The source node lost for good: its agent gone, its volume group
	// with the old volume and the seed too.
	if err := peer.KillAgent(ctx); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(guestExec(t, "pvs --noheadings -o pv_name -S vg_name="+peer.VG))
	guestExec(t, fmt.Sprintf("vgremove -q -ff -y %s && pvremove -q -ff -y %s", peer.VG, dev))
	// Later tests find the peer as the bed made it: an empty volume
	// group, its agent running.
	t.Cleanup(func() {
		if err := peer.StartAgent(context.Background()); err != nil {
			t.Errorf("the peer after the test: %v", err)
		}
	})
	release()
	lostAt := time.Now()
	waitFor(t, 15*time.Minute, "the move parked", func(ctx context.Context) (bool, string, error) {
		// The absent kubelet's part: the pod on the peer goes.
		if _, err := cluster.ForceDeletePodsOn(ctx, bed.Client, peerName); err != nil {
			return false, "", err
		}
		p, phase, err := phaseOf(ctx)
		if err != nil {
			return false, "", err
		}
		if phase == "" || phase == moveapi.PhaseRollingBack || phase == moveapi.PhaseBinding {
			return false, "", fmt.Errorf("the move went on to phase %q with its source lost: %v", phase, p.Annotations)
		}
		pv = p
		return phase == moveapi.PhaseParked, fmt.Sprintf("phase %s: %s", phase, p.Annotations[moveapi.AnnWaiting]), nil
	})
	t.Logf("parked %s after the source was lost: %s", time.Since(lostAt).Round(time.Second), pv.Annotations[moveapi.AnnParked])
	select {
	case err := <-done:
		if err == nil || !strings.Contains(moveOut.String(), "parked") {
			t.Errorf("kubectl carve move of a parked move: %v, want a failure saying parked:\n%s", err, moveOut.String())
		}
	case <-time.After(shortWait):
		t.Error("kubectl carve move still follows the parked move")
	}
	if from := pv.Annotations[moveapi.AnnParkedFrom]; from != moveapi.PhaseCatchingUp || !strings.Contains(pv.Annotations[moveapi.AnnParked], peerName) {
		t.Errorf("parked from %q for %q, want from %s naming node %s", from, pv.Annotations[moveapi.AnnParked], moveapi.PhaseCatchingUp, peerName)
	}
	// Events are recorded in the background: the park's may follow its
	// phase by a moment.
	waitFor(t, shortWait, "the "+moveapi.ReasonParked+" Event on the claim naming the kept target "+target, func(ctx context.Context) (bool, string, error) {
		ev := lastEventOf(ctx, ns, moveClaim, moveapi.ReasonParked)
		return strings.Contains(ev, target), ev, nil
	})

	// A rollback would have bound the claim to the old volume and deleted
	// the target within a few polls: for a full parked poll after the
	// mover's next look, nothing of the kind.
	waitFor(t, shortWait, "the parked move's next look", func(ctx context.Context) (bool, string, error) {
		p, _, err := phaseOf(ctx)
		if err != nil {
			return false, "", err
		}
		return strings.HasPrefix(p.Annotations[moveapi.AnnWaiting], "parked: "), p.Annotations[moveapi.AnnWaiting], nil
	})
	for end := time.Now().Add(35 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Second) {
		p, phase, err := phaseOf(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if phase != moveapi.PhaseParked || p.Annotations[moveapi.AnnSeed] != seed || p.Annotations[moveapi.AnnTargetID] != target {
			t.Fatalf("the parked move changed: %v", p.Annotations)
		}
		if tags := strings.TrimSpace(guestExec(t, "lvs --noheadings -o lv_tags "+target+" 2>/dev/null || echo gone")); tags == "gone" || strings.Contains(tags, volume.TagCopyPending) {
			t.Fatalf("the target %s while parked: %q, want it there and not %s", target, tags, volume.TagCopyPending)
		}
		if c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, moveClaim, metav1.GetOptions{}); err == nil && c.Spec.VolumeName != "" {
			t.Fatalf("claim %s is bound to %s while the move is parked", moveClaim, c.Spec.VolumeName)
		}
	}
	if ev := lastEventOf(ctx, ns, moveClaim, moveapi.ReasonRolledBack); !strings.HasPrefix(ev, "no Event") {
		t.Errorf("a %s Event: %s", moveapi.ReasonRolledBack, ev)
	}
	if got, err := guest.SHA256OfLV(ctx, target); err != nil || got != seedSum {
		t.Errorf("the parked target %s has SHA-256 %s (%v), want the seed's %s", target, got, err, seedSum)
	}

	// Salvage.
	seedAt, stoppedAt, ok := moveapi.WritesLost(pv.Annotations)
	if !ok {
		t.Fatalf("the seed's time or the stop's is not recorded: %v", pv.Annotations)
	}
	salvage, err := kubectlCarve(ctx, "move", ns+"/"+moveClaim, "--salvage").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl carve move --salvage: %v\n%s", err, salvage)
	}
	lost := fmt.Sprintf("the writes from the seed (%s) until the workload stopped (%s)", seedAt.Format(time.RFC3339), stoppedAt.Format(time.RFC3339))
	if !strings.Contains(string(salvage), lost) || !strings.Contains(string(salvage), "are lost") || !strings.Contains(string(salvage), target) {
		t.Errorf("kubectl carve move --salvage said:\n%s\nwant it naming the target %s and the lost writes: %s ... are lost", salvage, target, lost)
	}
	moved := waitClaimBound(t, ns, moveClaim, 5*time.Minute)
	if want := mover.TargetName(oldPV, nodeName); moved != want {
		t.Errorf("claim %s is bound to %s, want the mover's PV %s", moveClaim, moved, want)
	}
	if h := volumeHandle(t, moved); h != target {
		t.Errorf("the salvaged PV %s has volume %s, want the target %s", moved, h, target)
	}
	waitFor(t, shortWait, "the old PV "+oldPV+" gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, oldPV, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, "still there", err
	})
	if ev := lastEventOf(ctx, ns, moveClaim, moveapi.ReasonSalvaged); !strings.Contains(ev, "are lost") {
		t.Errorf("the %s Event: %q, want it naming the lost writes", moveapi.ReasonSalvaged, ev)
	}
	pod := waitPodReady(t, ctx, ns, movePod, nodeName, 2*podTimeout)
	if got := podExec(t, ns, movePod, "cd /data && sha256sum f log"); got != files {
		t.Errorf("on %s the pod reads\n%s\nwant what the source held\n%s", pod.Spec.NodeName, got, files)
	}
	t.Logf("salvaged: %s", strings.TrimSpace(string(salvage)))
}

// holdFinalizer is the test's finalizer that holds a claim being deleted.
const holdFinalizer = "carve.dev/test-hold"

// holdClaim adds holdFinalizer to the claim ns/name; the returned func
// (also run at cleanup) takes it away again.
func holdClaim(t *testing.T, ctx context.Context, ns, name string) func() {
	t.Helper()
	claims := bed.Client.CoreV1().PersistentVolumeClaims(ns)
	c, err := claims.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Finalizers = append(c.Finalizers, holdFinalizer)
	if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	uid := c.UID
	var once sync.Once
	release := func() {
		once.Do(func() {
			ctx := context.Background()
			for range 10 {
				c, err := claims.Get(ctx, name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) || err == nil && c.UID != uid {
					return
				}
				if err == nil {
					c.Finalizers = slices.DeleteFunc(c.Finalizers, func(f string) bool { return f == holdFinalizer })
					if _, err = claims.Update(ctx, c, metav1.UpdateOptions{}); err == nil {
						return
					}
				}
				t.Logf("releasing claim %s/%s: %v", ns, name, err)
				time.Sleep(time.Second)
			}
			t.Errorf("claim %s/%s keeps finalizer %s", ns, name, holdFinalizer)
		})
	}
	t.Cleanup(release)
	return release
}

// moveStatefulSet is the moved StatefulSet: not pinned (the move picks
// the node), its pod only sleeps.
func moveStatefulSet(ns string) *appsv1.StatefulSet {
	zero := int64(0)
	claim := newPVC(ns, "data", thickSC, moveSize())
	claim.Namespace = ""
	return newStatefulSet(ns, moveSet, corev1.PodSpec{
		TerminationGracePeriodSeconds: &zero,
		Containers: []corev1.Container{{
			Name: "app", Image: carveImage, ImagePullPolicy: corev1.PullNever,
			Command:      []string{"/bin/sh", "-c", sleeper},
			VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
		}},
	}, *claim)
}

// moveStats is what runMove saw of one move.
type moveStats struct {
	asked, stopped, bound, moved time.Time
	// ready is when the pod was first seen Ready on the target node
	// (moves to the guest node only; zero until then).
	ready time.Time
	// seed is the seed snapshot's ID (the old PV's annotation).
	seed string
	// event is the Event Moved's message on the claim.
	event string
	err   error
}

// startMove starts `kubectl carve move ns/claim --to node --timeout
// timeout`: out gathers what it writes, done carries how it ended.
func startMove(t *testing.T, ctx context.Context, ns, claim, node, timeout string) (out *strings.Builder, done <-chan error) {
	t.Helper()
	cmd := kubectlCarve(ctx, "move", ns+"/"+claim, "--to", node, "--timeout", timeout)
	out = &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- cmd.Wait() }()
	return out, ended
}

// runMove runs `kubectl carve move ns/claim --to node` (it waits until
// the move ends) and, beside it, watches the claim (moving to the guest
// node, also whether the StatefulSet's pod movePod is Ready there): when the claim is
// being deleted while pods of the namespace are on the peer, it deletes
// them at once (no kubelet there ends them). It returns the command's
// output and what it saw.
func runMove(t *testing.T, ctx context.Context, ns, claim, node, oldPV string) (string, moveStats) {
	t.Helper()
	st := moveStats{asked: time.Now()}
	out, done := startMove(t, ctx, ns, claim, node, "10m")
	var uid types.UID
	for tick := time.NewTicker(200 * time.Millisecond); ; {
		select {
		case err := <-done:
			tick.Stop()
			st.moved = time.Now()
			st.err = err
			if st.bound.IsZero() {
				st.bound = st.moved
			}
			st.event = lastEventOf(ctx, ns, claim, moveapi.ReasonMoved)
			return out.String(), st
		case <-tick.C:
		}
		if pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, oldPV, metav1.GetOptions{}); err == nil && pv.Annotations[moveapi.AnnSeed] != "" {
			st.seed = pv.Annotations[moveapi.AnnSeed]
		}
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		switch {
		case err != nil:
		case uid == "":
			uid = c.UID
		case c.UID == uid && c.DeletionTimestamp != nil && st.stopped.IsZero():
			st.stopped = time.Now()
		case c.UID != uid && st.stopped.IsZero():
			// The old claim went between two polls (nothing held it):
			// it was deleted at most one poll ago, so the downtime
			// measured from here is short by less than a poll.
			st.stopped = time.Now()
			t.Logf("claim %s/%s was deleted and made again between two polls", ns, claim)
		case c.UID != uid && c.Status.Phase == corev1.ClaimBound && c.Spec.VolumeName != oldPV && st.bound.IsZero():
			st.bound = time.Now()
		}
		if node == nodeName && st.ready.IsZero() && !st.stopped.IsZero() {
			if p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, movePod, metav1.GetOptions{}); err == nil && podReadyOn(p, node) {
				st.ready = time.Now()
			}
		}
		if err == nil && c.DeletionTimestamp != nil {
			if _, err := cluster.ForceDeletePodsOn(ctx, bed.Client, peerName); err != nil {
				t.Log(err)
			}
		}
	}
}

// kubectlCarve is the command bin/kubectl-carve (built beside bin/carve)
// with args, through the bed's kubeconfig.
func kubectlCarve(ctx context.Context, args ...string) *exec.Cmd {
	bin := filepath.Join(filepath.Dir(bed.Config.CarveBin), "kubectl-carve")
	return exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", bed.Control.Kubeconfig}, args...)...)
}

// checkMoved checks the end of a move of claim from oldPV (volume
// oldHandle) to node: the claim Bound to the mover's PV there, whose LV
// is in vg; the old PV, the old LV and the seed snapshot (its ID, as the
// old PV's annotation gave it) gone. It returns the new PV's name.
func checkMoved(t *testing.T, ctx context.Context, ns, claim, oldPV, oldHandle, node, vg, seed string) string {
	t.Helper()
	pv := waitClaimBound(t, ns, claim, shortWait)
	if want := mover.TargetName(oldPV, node); pv != want {
		t.Errorf("claim %s is bound to %s, want the mover's PV %s", claim, pv, want)
	}
	if got := pvNode(t, pv); got != node {
		t.Errorf("the moved PV %s is on node %s, want %s", pv, got, node)
	}
	if h := volumeHandle(t, pv); !strings.HasPrefix(h, vg+"/") {
		t.Errorf("the moved volume %s is not in %s's volume group %s", h, node, vg)
	}
	if _, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, oldPV, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the old PV %s is still there (%v)", oldPV, err)
	}
	gone := []string{oldHandle}
	if _, svg, slv, err := volume.ParseSnapshotID(seed); err == nil {
		gone = append(gone, svg+"/"+slv)
	} else {
		t.Errorf("the seed snapshot of the move was never seen on PV %s: %q", oldPV, seed)
	}
	for _, lv := range gone {
		if out := strings.TrimSpace(guestExec(t, "lvs --noheadings -o lv_name "+lv+" 2>/dev/null || true")); out != "" {
			t.Errorf("the LV %s is still there after the move", lv)
		}
	}
	return pv
}

// closedSum is the SHA-256 of an LV once closed, or why not.
type closedSum struct {
	sum string
	err error
}

// sumWhenClosed reads, in the guest, the SHA-256 of the LV vgLV as soon
// as nothing holds it open (its pod stopped and the kubelet unstaged it):
// from then on only the catch-up reads it, and its removal waits while
// the sum holds it open.
func sumWhenClosed(ctx context.Context, vgLV string) <-chan closedSum {
	ch := make(chan closedSum, 1)
	script := fmt.Sprintf(`set -e
end=$(( $(date +%%s) + 600 ))
while [ -n "$(lvs --noheadings -o lv_device_open %[1]s | tr -d ' ')" ]; do
  [ $(date +%%s) -lt $end ] || { echo "%[1]s still open after 600 s"; exit 1; }
  sleep 0.1
done
sha256sum < /dev/%[1]s
`, vgLV)
	go func() {
		out, err := bed.GuestNode(nodeName).Exec(ctx, script)
		f := strings.Fields(out)
		if err == nil && (len(f) == 0 || len(f[0]) != 64) {
			err = fmt.Errorf("sha256sum printed %q", out)
		}
		if err != nil {
			ch <- closedSum{err: err}
			return
		}
		ch <- closedSum{sum: f[0]}
	}()
	return ch
}

// filesOnLV mounts the ext4 LV vgLV read-only without its journal in the
// guest (no byte of it changes) and returns `sha256sum f log` there.
func filesOnLV(t *testing.T, ctx context.Context, vgLV string) string {
	t.Helper()
	out, err := bed.GuestNode(nodeName).Exec(ctx, fmt.Sprintf(`set -e
[ -e /dev/%[1]s ] || lvchange -q -ay %[1]s
d=$(mktemp -d)
mount -o ro,noload /dev/%[1]s "$d"
(cd "$d" && sha256sum f log) || { umount "$d"; exit 1; }
umount "$d"
rmdir "$d"
`, vgLV))
	if err != nil {
		t.Fatalf("the files on %s: %v", vgLV, err)
	}
	return strings.TrimSpace(out)
}

// waitPodReady waits until a StatefulSet's pod is Ready (on node, when
// set) and returns it.
func waitPodReady(t *testing.T, ctx context.Context, ns, pod, node string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	waitFor(t, timeout, "pod "+pod+" Ready", func(ctx context.Context) (bool, string, error) {
		p, status, err := statefulSetPod(ctx, ns, pod)
		if p == nil {
			return false, status, err
		}
		got = p
		return podReadyOn(p, node), "on " + p.Spec.NodeName + ": " + podState(p), nil
	})
	return got
}

// waitPodScheduled waits until a StatefulSet's pod is scheduled to node
// and not being deleted.
func waitPodScheduled(t *testing.T, ns, pod, node string) {
	t.Helper()
	waitFor(t, podTimeout, "the StatefulSet's pod scheduled to "+node, func(ctx context.Context) (bool, string, error) {
		p, status, err := statefulSetPod(ctx, ns, pod)
		if p == nil {
			return false, status, err
		}
		return p.Spec.NodeName == node && p.DeletionTimestamp == nil, "on " + p.Spec.NodeName + ": " + podState(p), nil
	})
}

// statefulSetPod gets a StatefulSet's pod for a wait: nil and a status
// while there is none (its StatefulSet makes it again), nil and the
// error when the API server fails.
func statefulSetPod(ctx context.Context, ns, pod string) (*corev1.Pod, string, error) {
	p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, "no pod (its StatefulSet makes it again)", nil
	}
	if err != nil {
		return nil, "", err
	}
	return p, "", nil
}

// podReadyOn tells a pod that runs and is Ready on node ("": any).
func podReadyOn(p *corev1.Pod, node string) bool {
	if p.DeletionTimestamp != nil || node != "" && p.Spec.NodeName != node || !allRunning(p) {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// cordon marks node unschedulable or schedulable again.
func cordon(t *testing.T, ctx context.Context, node string, on bool) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, on)
	if _, err := bed.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("cordon %s (%t): %v", node, on, err)
	}
}

// lastEventOf is the message of the last Event of that reason on the
// object named name in ns.
func lastEventOf(ctx context.Context, ns, name, reason string) string {
	evs, err := bed.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
	if err != nil || len(evs.Items) == 0 {
		return fmt.Sprintf("no Event %s (%v)", reason, err)
	}
	last := evs.Items[0]
	for _, e := range evs.Items[1:] {
		if e.LastTimestamp.After(last.LastTimestamp.Time) || e.EventTime.After(last.EventTime.Time) {
			last = e
		}
	}
	return last.Message
}

// pvWatch collects, in the order made, the names of the PVs made for
// claims of one namespace.
type pvWatch struct {
	mu   sync.Mutex
	made []string
}

func (w *pvWatch) names() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.made)
}

// watchPVs watches PVs until ctx ends and collects those made for ns.
func watchPVs(t *testing.T, ctx context.Context, ns string) *pvWatch {
	t.Helper()
	w := &pvWatch{}
	wi, err := bed.Client.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer wi.Stop()
		for ev := range wi.ResultChan() {
			pv, ok := ev.Object.(*corev1.PersistentVolume)
			if !ok || ev.Type != watch.Added || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != ns {
				continue
			}
			w.mu.Lock()
			if !slices.Contains(w.made, pv.Name) {
				w.made = append(w.made, pv.Name)
			}
			w.mu.Unlock()
		}
	}()
	return w
}
