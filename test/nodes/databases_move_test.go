//go:build nodes && databases

package nodes

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// The database tier's scenarios across nodes (make test-databases
// DATABASES_PEER=1): the bed's peer node (a second node agent with its
// own volume group in the guest, and no kubelet) holds a database's
// volume for a while; PostgreSQL runs on the guest node before and after.

// TestCrossNodeDatabaseRestoreOnThePeer: a VolumeSnapshot of the live
// database (thick), taken once the client has acksBeforeSnapshot
// transactions acknowledged while pgbench writes, restored by a claim
// selected on the peer (a copy across nodes), then moved by `kubectl
// carve move` to the guest node (the peer runs no pods). PostgreSQL
// started there recovers by itself (WAL replay) and holds every
// transaction acknowledged before the snapshot was asked for; the checks
// pass on it and on the source.
func TestCrossNodeDatabaseRestoreOnThePeer(t *testing.T) {
	peer := needPeer(t)
	began := time.Now()
	dc := dynamicClient(t)
	ns := newNamespace(t, "pgcross")
	w, b := busyDatabase(t, ns, thickSC)

	t.Cleanup(func() { deleteSnapshot(t, dc, ns, "snap") })
	ctx := testCtx(t, 30*time.Minute)
	asked := time.Now()
	if err := kubetest.CreateVolumeSnapshot(ctx, dc, ns, "snap", snapshotClass, "data"); err != nil {
		t.Fatal(err)
	}
	waitSnapshotReady(t, dc, ns, "snap")
	before := w.acks.Before(asked)
	b.wait(t)
	w.finish(t)
	all := w.acks.All()

	group := "snapshot.storage.k8s.io"
	restored := newPVC(ns, "restored", thickSC, "1Gi")
	restored.Annotations = map[string]string{placement.AnnSelectedNode: peerName}
	restored.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
	start := time.Now()
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, restored, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	onPeer := waitClaimBound(t, ns, "restored", 10*time.Minute)
	copied := time.Since(start)
	if got := pvNode(t, onPeer); got != peerName {
		t.Fatalf("the restored claim's PV %s is on node %s, want %s", onPeer, got, peerName)
	}
	peerHandle := volumeHandle(t, onPeer)
	if !strings.HasPrefix(peerHandle, peer.VG+"/") {
		t.Errorf("the restored volume %s is not in the peer's volume group %s", peerHandle, peer.VG)
	}

	out, st := runMove(t, ctx, ns, "restored", nodeName, onPeer)
	if st.err != nil {
		t.Fatalf("kubectl carve move to %s: %v\n%s", nodeName, st.err, out)
	}
	checkMoved(t, ctx, ns, "restored", onPeer, peerHandle, nodeName, "carve", st.seed)
	recovered := startPostgres(t, ns, postgresPod(ns, "pg-restored", "restored", 0))
	checkRecovered(t, ns, "pg-restored")

	checkDatabase(t, ns, "pg", all)
	checkDatabase(t, ns, "pg-restored", before)
	t.Logf("MEASURE database snapshot restored on %s and moved to %s: %s in all; restored on the peer %s after its claim was created; moved in %s; restored server answering %s after its pod; %d acknowledged ids checked on the source, %d (acknowledged before the snapshot) on the restore",
		peerName, nodeName, time.Since(began).Round(time.Second), copied.Round(time.Second), st.moved.Sub(st.asked).Round(time.Second), recovered.Round(time.Second), len(all), len(before))
}

// TestCrossNodeDatabaseMove: `kubectl carve move` of the claim of a live
// database's StatefulSet (PostgreSQL on the guest node's network, its
// first pod there) to the peer and back, while pgbench and the client
// write until the workload stops. The move stops the workload by design
// for its catch-up (the claim and its pods deleted, the pod made again by
// the StatefulSet on the target); on the peer, which runs no pods, the
// database stays stopped, and the move back brings it to the guest node,
// where PostgreSQL recovers by itself and holds every transaction the
// client had acknowledged; the checks pass. The downtime reported is the
// client's: its last acknowledged transaction before the stop to its
// first after the start on the guest node, across both moves.
func TestCrossNodeDatabaseMove(t *testing.T) {
	peer := needPeer(t)
	began := time.Now()
	ctx := testCtx(t, 40*time.Minute)
	addr := bed.GuestNode(nodeName).HostPorts[postgresPort]
	if addr == "" {
		t.Fatal("the guest node forwards no port to PostgreSQL: run make test-databases (CARVE_POSTGRES_IMAGE)")
	}
	ns, pvs := startMovedSets(t, ctx, "pgmove", postgresSet(moveSet, postgresPort))
	waitPostgres(t, ns, movePod)
	initBench(t, ns, movePod)
	w := startAckWriter(t, addr)
	// pgbench's kubectl exec ends when the move stops its pod.
	startBench(t, ns, movePod, 20*time.Minute)
	waitAcked(t, w, 500)

	oldPV := pvOf(t, ns, moveClaim)
	source := volumeHandle(t, oldPV)
	out, st := runMove(t, ctx, ns, moveClaim, peerName, oldPV)
	if st.err != nil {
		t.Fatalf("kubectl carve move to %s: %v\n%s", peerName, st.err, out)
	}
	onPeer := checkMoved(t, ctx, ns, moveClaim, oldPV, source, peerName, peer.VG, st.seed)
	atStop := w.acks.Len()
	toPeer := st.moved.Sub(st.asked)
	t.Logf("moved to %s in %s (%d transactions acknowledged, none can be while the database is on the peer); %s", peerName, toPeer.Round(time.Second), atStop, st.event)

	peerHandle := volumeHandle(t, onPeer)
	out, st = runMove(t, ctx, ns, moveClaim, nodeName, onPeer)
	if st.err != nil {
		t.Fatalf("kubectl carve move to %s: %v\n%s", nodeName, st.err, out)
	}
	checkMoved(t, ctx, ns, moveClaim, onPeer, peerHandle, nodeName, "carve", st.seed)
	waitPodReady(t, ctx, ns, movePod, nodeName, podTimeout)
	waitPostgres(t, ns, movePod)
	log, _ := pgExec(ctx, ns, movePod, time.Minute, "grep -E 'redo|recover|interrupted|ready to accept' /tmp/postgres.log")
	t.Logf("back on %s, the server's log of its start:\n%s", nodeName, log)
	waitFor(t, 5*time.Minute, "the client's transactions acknowledged again", func(context.Context) (bool, string, error) {
		n := w.acks.Len() - atStop
		return n >= 20, fmt.Sprintf("%d acknowledged since the move back; the client's last error: %v", n, w.lastErr()), nil
	})
	close(w.stop)
	<-w.done
	last, first := w.acks.LongestGap()
	all := w.acks.All()
	checkDatabase(t, ns, movePod, all)
	if len(pvs.names()) != 3 {
		t.Errorf("PVs made for namespace %s: %v, want the first and the mover's two", ns, pvs.names())
	}
	t.Logf("MEASURE database move to %s and back: %s in all; to the peer %s, back (request to moved) %s; the client's downtime (last acknowledged before the stop to first after the start) %s; %d acknowledged ids checked (%d before the stop)",
		peerName, time.Since(began).Round(time.Second), toPeer.Round(time.Second), st.moved.Sub(st.asked).Round(time.Second), first.Sub(last).Round(time.Second), len(all), atStop)
}

// TestCrossNodeDatabaseDrain: `kubectl carve drain` of the guest node
// (cordoned first, as docs/operations.md asks) with two live PostgreSQL
// StatefulSets, each with its own client recording every acknowledged
// transaction and pgbench writing until the move stops it, to the peer;
// then of the peer back to the guest node (the peer runs no pods). Both
// databases start again on their claims, hold every transaction their
// clients had acknowledged, and the checks pass on both. Each client's
// downtime is reported.
func TestCrossNodeDatabaseDrain(t *testing.T) {
	needPeer(t)
	began := time.Now()
	ctx := testCtx(t, 45*time.Minute)
	type database struct {
		set, pod string
		port     int
		w        *ackWriter
	}
	dbs := []*database{{set: "dba", port: postgresPort}, {set: "dbb", port: postgresSecondPort}}
	var sets []func(string) *appsv1.StatefulSet
	for _, d := range dbs {
		if bed.GuestNode(nodeName).HostPorts[d.port] == "" {
			t.Fatalf("the guest node forwards no port %d: run make test-databases (CARVE_POSTGRES_IMAGE)", d.port)
		}
		d.pod = d.set + "-0"
		sets = append(sets, postgresSet(d.set, d.port))
	}
	ns, pvs := startMovedSets(t, ctx, "pgdrain", sets...)
	for _, d := range dbs {
		waitPostgres(t, ns, d.pod)
		initBench(t, ns, d.pod)
		d.w = startAckWriter(t, bed.GuestNode(nodeName).HostPorts[d.port])
		// pgbench's kubectl exec ends when the move stops its pod.
		startBench(t, ns, d.pod, 30*time.Minute)
	}
	for _, d := range dbs {
		waitAcked(t, d.w, 300)
	}

	drain := func(from, to string) time.Duration {
		out, took := cordonAndDrain(t, ctx, from, to, "15m")
		for _, want := range []string{fmt.Sprintf("node %s: 2 claim(s) to move", from), fmt.Sprintf("node %s: every carve claim moved off it", from)} {
			if !strings.Contains(string(out), want) {
				t.Errorf("kubectl carve drain %s said nothing like %q", from, want)
			}
		}
		for _, d := range dbs {
			if got := pvNode(t, pvOf(t, ns, "data-"+d.pod)); got != to {
				t.Errorf("claim data-%s is bound to a volume on %s after the drain, want %s", d.pod, got, to)
			}
		}
		cordon(t, ctx, from, false)
		return took
	}
	toPeer := drain(nodeName, peerName)
	atStop := make([]int, len(dbs))
	for i, d := range dbs {
		atStop[i] = d.w.acks.Len()
	}
	back := drain(peerName, nodeName)

	var report []string
	for i, d := range dbs {
		waitPodReady(t, ctx, ns, d.pod, nodeName, podTimeout)
		waitPostgres(t, ns, d.pod)
		waitFor(t, 5*time.Minute, d.set+"'s client acknowledged again", func(context.Context) (bool, string, error) {
			n := d.w.acks.Len() - atStop[i]
			return n >= 20, fmt.Sprintf("%d acknowledged since the drain back; the client's last error: %v", n, d.w.lastErr()), nil
		})
		close(d.w.stop)
		<-d.w.done
		last, first := d.w.acks.LongestGap()
		all := d.w.acks.All()
		checkDatabase(t, ns, d.pod, all)
		report = append(report, fmt.Sprintf("%s: downtime %s, %d acknowledged ids checked (%d before the drain)", d.set, first.Sub(last).Round(time.Second), len(all), atStop[i]))
	}
	if n := len(pvs.names()); n != 6 {
		t.Errorf("PVs made for namespace %s: %v, want the first two and the mover's four", ns, pvs.names())
	}
	t.Logf("MEASURE database drain to %s and back: %s in all; drain to the peer %s, back %s; %s",
		peerName, time.Since(began).Round(time.Second), toPeer.Round(time.Second), back.Round(time.Second), strings.Join(report, "; "))
}

// postgresSet makes a StatefulSet named name: one PostgreSQL
// (postgresPod's container, on the guest's network, on hostPort) with a
// thick 1Gi claim "data" from its template, not pinned: a move must be
// free to take its pod to the target.
func postgresSet(name string, hostPort int) func(ns string) *appsv1.StatefulSet {
	return func(ns string) *appsv1.StatefulSet {
		pod := postgresPod(ns, name+"-0", "data", hostPort)
		pod.Spec.NodeSelector = nil
		pod.Spec.Volumes = nil
		claim := newPVC(ns, "data", thickSC, "1Gi")
		claim.Namespace = ""
		return newStatefulSet(ns, name, pod.Spec, *claim)
	}
}
