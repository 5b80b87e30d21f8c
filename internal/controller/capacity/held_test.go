package capacity

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// heldGauge is carve_capacity_deletions_held, -1 when it is not exported.
func heldGauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "carve_capacity_deletions_held" && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func (h *harness) wantHeld(want float64) {
	h.t.Helper()
	h.eventually(fmt.Sprintf("carve_capacity_deletions_held %v", want), func() error {
		if got := heldGauge(h.t, h.reg); got != want {
			return fmt.Errorf("is %v", got)
		}
		return nil
	})
}

// leftBy are the objects of nodes, in fast, that a previous leader wrote.
func leftBy(nodes ...string) []runtime.Object {
	old, err := New(Config{Client: fake.NewClientset(), Namespace: testNS, Driver: testDriver, TopologyKey: testKey})
	if err != nil {
		panic(err)
	}
	prev := &harness{w: old}
	objs := []runtime.Object{wffc("fast", "ssd")}
	for i, n := range nodes {
		objs = append(objs, prev.existing(n, "fast", int64(i+1)*gi))
	}
	return objs
}

// TestNoNodeReachedHoldsDeletions: a leader whose pool reaches no node
// (its own network is broken) keeps every object when the grace ends,
// and still writes for a node that does report.
func TestNoNodeReachedHoldsDeletions(t *testing.T) {
	h := start(t, time.Hour, leftBy("node-a", "node-b", "node-c")...)
	if got := heldGauge(t, h.reg); got != 0 {
		t.Errorf("carve_capacity_deletions_held %v at the start, want 0: exported from the start, for the alert", got)
	}
	h.w.endGrace(h.ctx)
	// Marker: with one worker, node-m's object is written after the
	// grace's items were handled. One node reporting of four known
	// does not end the hold.
	h.w.Report("node-m", report("node-m", class{name: "ssd", avail: gi, maxVol: gi}))
	h.holds("node-m", "fast", gi, gi)
	for i, n := range []string{"node-a", "node-b", "node-c"} {
		h.holds(n, "fast", int64(i+1)*gi, int64(i+1)*gi)
	}
	h.wantWrites(map[string]int{"create": 1})
	h.wantHeld(1)
}

// startFiveNodes is a writer whose five nodes, node-a to node-e, have
// reported and have their objects of class fast written (1 GiB each); the
// writes so far are cleared.
func startFiveNodes(t *testing.T) (*harness, []string) {
	t.Helper()
	h := start(t, time.Hour, wffc("fast", "ssd"))
	nodes := []string{"node-a", "node-b", "node-c", "node-d", "node-e"}
	for _, n := range nodes {
		h.w.Report(n, report(n, class{name: "ssd", avail: gi, maxVol: gi}))
	}
	for _, n := range nodes {
		h.holds(n, "fast", gi, gi)
	}
	h.client.ClearActions()
	return h, nodes
}

// TestMostNodesDropHoldsDeletions: most nodes leaving the pool together
// (an outage of the agents' network or Service, not of each node) keeps
// their objects.
func TestMostNodesDropHoldsDeletions(t *testing.T) {
	h, nodes := startFiveNodes(t)
	for _, n := range nodes[:3] {
		h.w.Report(n, nil)
	}
	// Past the moment a dropped node waits, then a marker: with one
	// worker, node-d's update is written after the drops were judged.
	time.Sleep(2 * time.Second)
	h.w.Report("node-d", report("node-d", class{name: "ssd", avail: 2 * gi, maxVol: gi}))
	h.holds("node-d", "fast", 2*gi, gi)
	for _, n := range nodes[:3] {
		h.holds(n, "fast", gi, gi)
	}
	h.wantWrites(map[string]int{"update": 1})
	h.wantHeld(1)
}

// TestOneNodeDropsIsDeleted: one node of many leaving for good loses its
// objects, as it always did.
func TestOneNodeDropsIsDeleted(t *testing.T) {
	h, _ := startFiveNodes(t)
	h.w.Report("node-c", nil)
	h.holds("node-c", "fast", -1, 0)
	h.wantWrites(map[string]int{"delete": 1})
	h.wantHeld(0)
}

// TestHoldEndsWhenNodesReport: the hold ends once the nodes report again;
// a node still silent then gets a new grace, and its objects go after it.
func TestHoldEndsWhenNodesReport(t *testing.T) {
	h := start(t, time.Hour, leftBy("node-a", "node-b", "node-c", "node-d")...)
	h.w.endGrace(h.ctx)
	h.w.Report("node-a", report("node-a", class{name: "ssd", avail: 7 * gi, maxVol: gi}))
	// Held, yet the node that reports is written.
	h.holds("node-a", "fast", 7*gi, gi)
	h.holds("node-d", "fast", 4*gi, 4*gi)
	h.wantHeld(1)
	h.wantWrites(map[string]int{"update": 1})

	h.w.Report("node-b", report("node-b", class{name: "ssd", avail: gi, maxVol: gi}))
	h.w.Report("node-c", report("node-c", class{name: "ssd", avail: gi, maxVol: gi}))
	h.wantHeld(0)
	h.holds("node-c", "fast", gi, gi)
	h.holds("node-d", "fast", 4*gi, 4*gi) // a new grace
	h.w.endGrace(h.ctx)
	h.holds("node-d", "fast", -1, 0)
	h.wantHeld(0)
}

// TestHeldTooLongGivesUp: a writer that holds its deletions for a grace
// returns from Run, so that the replica gives up the Lease; the objects
// stay, and it can lead again later.
func TestHeldTooLongGivesUp(t *testing.T) {
	client := fake.NewClientset(leftBy("node-a", "node-b")...)
	reg := prometheus.NewPedanticRegistry()
	w, err := New(Config{Client: client, Namespace: testNS, Driver: testDriver, TopologyKey: testKey,
		Registerer: reg, StartupGrace: 300 * time.Millisecond, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrDeletionsHeld) {
			t.Fatalf("Run returned %v, want ErrDeletionsHeld", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still runs 10 s after holding its deletions")
	}
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := client.StorageV1().CSIStorageCapacities(testNS).Get(ctx, w.objectName(key{node: n, sc: "fast"}),
			metav1.GetOptions{}); err != nil {
			t.Errorf("object of %s: %v", n, err)
		}
	}
	if got := heldGauge(t, reg); got != 0 {
		t.Errorf("carve_capacity_deletions_held %v after Run, want 0: the replica no longer writes", got)
	}

	// Leading again, with both nodes reporting.
	h := &harness{t: t, client: client, w: w, reg: reg, ctx: ctx}
	go func() { done <- w.Run(ctx) }()
	w.Report("node-a", report("node-a", class{name: "ssd", avail: 5 * gi, maxVol: gi}))
	w.Report("node-b", report("node-b", class{name: "ssd", avail: 6 * gi, maxVol: gi}))
	h.holds("node-a", "fast", 5*gi, gi)
	h.holds("node-b", "fast", 6*gi, gi)
	time.Sleep(time.Second) // past the grace and a hold's
	cancel()
	if err := <-done; err != nil {
		t.Errorf("second Run: %v", err)
	}
	if _, err := client.StorageV1().CSIStorageCapacities(testNS).Get(context.Background(),
		w.objectName(key{node: "node-a", sc: "fast"}), metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Error("node-a's object deleted")
	}
}
