package audit

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/controller/objects"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

const (
	testDriver = "lvm.carve.dev"
	testKey    = "topology.carve.dev/node"
)

// fakeNodes holds each node's inventory (a node without one fails to
// answer), quarantines with quarantine and removes with remove.
type fakeNodes struct {
	names      []string
	inv        map[string]*Inventory
	quarantine func(ctx context.Context, node, vg, name string, at time.Time) (string, error)
	remove     func(ctx context.Context, node, vg, name, orphanOf string) error
	// health is each node's health report (none: all healthy).
	health map[string][]VolumeHealth
	// invalid are each node's invalid snapshot IDs.
	invalid map[string][]string
}

func (f *fakeNodes) InvalidSnapshots(_ context.Context, node string) ([]string, error) {
	if _, ok := f.inv[node]; !ok {
		return nil, errors.New("node agent unreachable")
	}
	return f.invalid[node], nil
}

func (f *fakeNodes) VolumeHealth(_ context.Context, node string) ([]VolumeHealth, error) {
	if _, ok := f.inv[node]; !ok {
		return nil, errors.New("node agent unreachable")
	}
	return f.health[node], nil
}

func (f *fakeNodes) Names() []string { return f.names }

func (f *fakeNodes) Inventory(_ context.Context, node string) (*Inventory, error) {
	inv, ok := f.inv[node]
	if !ok {
		return nil, errors.New("node agent unreachable")
	}
	return inv, nil
}

func (f *fakeNodes) QuarantineOrphan(ctx context.Context, node, vg, name string, at time.Time) (string, error) {
	if f.quarantine == nil {
		return "", errors.New("no quarantine")
	}
	return f.quarantine(ctx, node, vg, name, at)
}

func (f *fakeNodes) RemoveOrphan(ctx context.Context, node, vg, name, orphanOf string) error {
	if f.remove == nil {
		return errors.New("no removal")
	}
	return f.remove(ctx, node, vg, name, orphanOf)
}

// lvmNodes makes f act on its inventories as a node does: a quarantine
// renames and tags the LV, a removal drops it. Both are recorded as
// "<node>:<vg>/<name>"; what fails names errors for.
func lvmNodes(f *fakeNodes, fails map[string]error) (quarantined, removed *[]string) {
	quarantined, removed = new([]string), new([]string)
	find := func(node, vg, name string) int {
		return slices.IndexFunc(f.inv[node].LVs, func(lv LV) bool { return lv.VolumeGroup == vg && lv.Name == name })
	}
	f.quarantine = func(_ context.Context, node, vg, name string, at time.Time) (string, error) {
		if err := fails[name]; err != nil {
			return "", err
		}
		i := find(node, vg, name)
		if i < 0 {
			return "", nil
		}
		lv := &f.inv[node].LVs[i]
		lv.OrphanOf, lv.Name, lv.OrphanedAt = lv.Name, "carve-orphan-"+strings.TrimPrefix(lv.Name, "carve-"), at.Truncate(time.Second)
		*quarantined = append(*quarantined, node+":"+vg+"/"+name)
		return lv.Name, nil
	}
	f.remove = func(_ context.Context, node, vg, name, orphanOf string) error {
		if err := fails[name]; err != nil {
			return err
		}
		i := find(node, vg, name)
		if i < 0 || f.inv[node].LVs[i].OrphanOf != orphanOf {
			return errors.New("not that quarantine")
		}
		f.inv[node].LVs = slices.Delete(f.inv[node].LVs, i, i+1)
		*removed = append(*removed, node+":"+vg+"/"+name)
		return nil
	}
	return quarantined, removed
}

func kubePV(name, driver, handle, onNode string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: testKey, Operator: corev1.NodeSelectorOpIn, Values: []string{onNode}}}}}}},
			ClaimRef: &corev1.ObjectReference{Namespace: "ns", Name: "claim-" + name, UID: "uid-" + types.UID(name)},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
}

// pvsThroughCache passes PVs through the informer's transform and filter.
func pvsThroughCache(t *testing.T, a *Auditor, pvs ...*corev1.PersistentVolume) []PV {
	t.Helper()
	var objs []*corev1.PersistentVolume
	for _, pv := range pvs {
		o, err := objects.Trim(testDriver)(pv)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o.(*corev1.PersistentVolume))
	}
	return a.pvsOf(objs)
}

func TestPass(t *testing.T) {
	const grace = time.Minute
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	alive := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "alive", UID: "1111"}}
	renamed := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "reused", UID: "2222"}}
	client := fake.NewClientset(alive, renamed)
	inv := &Inventory{Classes: []Class{{"fast", "vg1"}, {"slow", "vg1"}}, LVs: []LV{
		{VolumeGroup: "vg1", Name: "carve-orphan", Class: "fast", Size: 1 << 30, VolumeName: "pvc-9999", Claim: "ns/gone"},
		{VolumeGroup: "vg1", Name: "carve-alive", Class: "fast", Size: 2 << 30, VolumeName: "pvc-1111", Claim: "ns/alive"},
		// Same claim name, another claim (deleted and made anew): orphan.
		{VolumeGroup: "vg1", Name: "carve-reused", Class: "fast", Size: 4 << 30, VolumeName: "pvc-3333", Claim: "ns/reused"},
		{VolumeGroup: "vg1", Name: "carve-bound", Class: "fast", Size: 1 << 30, VolumeName: "pv-bound"},
		// Its only PV is another driver's, with the same handle.
		{VolumeGroup: "vg1", Name: "carve-foreign", Class: "slow", Size: 8 << 30, VolumeName: "pvc-8888"},
	}}
	events := record.NewFakeRecorder(100)
	reg := prometheus.NewPedanticRegistry()
	nodes := &fakeNodes{names: []string{node}, inv: map[string]*Inventory{node: inv}}
	quarantined, removed := lvmNodes(nodes, map[string]error{"carve-reused": errors.New("lvchange failed")})
	const removal = 3 * grace
	a := New(Config{Driver: testDriver, TopologyKey: testKey, Client: client, Nodes: nodes,
		Grace: grace, RemovalGrace: removal, Interval: time.Second, Registerer: reg, Events: events, RemoveOrphans: true})
	pvs := pvsThroughCache(t, a,
		kubePV("pv-bound", testDriver, "vg1/carve-bound", node),
		kubePV("pv-lost", testDriver, "vg1/carve-lost", node),
		kubePV("pv-other-driver", "other.csi.example", "vg1/carve-foreign", node),
		kubePV("pv-lost-elsewhere", testDriver, "vg1/carve-x", "node-b"),
	)
	if len(pvs) != 3 {
		t.Fatalf("PVs of carve through the cache: %+v, want 3 (the other driver's dropped)", pvs)
	}

	ctx := context.Background()
	a.Pass(ctx, t0, pvs)
	if n := len(events.Events); n != 0 {
		t.Fatalf("%d events before the grace period: %v", n, <-events.Events)
	}
	if got := testutil.ToFloat64(a.m.orphans.WithLabelValues(node, "fast", "vg1")); got != 0 {
		t.Errorf("orphans before the grace period: %v", got)
	}

	got := passEvents(ctx, a, events, t0.Add(grace), pvs)
	want := []string{
		"Warning OrphanedVolume LV vg1/carve-foreign",
		"Warning OrphanedVolume LV vg1/carve-orphan",
		"Warning OrphanedVolume LV vg1/carve-reused",
		"Warning VolumeDataMissing the LV vg1/carve-lost of PersistentVolume pv-lost", // on the PV
		"Warning VolumeDataMissing the LV vg1/carve-lost of PersistentVolume pv-lost", // on the PVC
		// carve-foreign names no claim: never touched.
		"Normal OrphanedVolumeQuarantined quarantined orphaned LV vg1/carve-orphan as vg1/carve-orphan-orphan",
		// The missing LV is also the claim's health event.
		"Warning VolumeAbnormal volume vg1/carve-lost (PersistentVolume pv-lost) on node node-a is abnormal (LogicalVolumeMissing)",
	}
	checkEvents(t, got, want)
	if !strings.Contains(got[1], "claim ns/gone") || !strings.Contains(got[1], "1073741824 bytes") {
		t.Errorf("orphan event does not name claim and size: %q", got[1])
	}
	if !strings.Contains(got[0], "no claim tag") {
		t.Errorf("the event of an orphan without a claim tag does not say so: %q", got[0])
	}
	if !strings.Contains(got[5], "lvrename vg1 carve-orphan-orphan carve-orphan") {
		t.Errorf("the quarantine event does not say how to restore: %q", got[5])
	}
	if !slices.Equal(*quarantined, []string{node + ":vg1/carve-orphan"}) || len(*removed) != 0 {
		t.Errorf("quarantined %v, removed %v; want carve-orphan quarantined, nothing removed", *quarantined, *removed)
	}
	// What the quarantine failed for stays reported; what was
	// quarantined shows as such.
	checkGauges(t, []gauge{
		{a.m.orphans.WithLabelValues(node, "fast", "vg1"), 1},
		{a.m.orphanBytes.WithLabelValues(node, "fast", "vg1"), 4 << 30},
		{a.m.orphans.WithLabelValues(node, "slow", "vg1"), 1},
		{a.m.quarantined.WithLabelValues(node, "fast", "vg1"), 1},
		{a.m.quarantinedBytes.WithLabelValues(node, "fast", "vg1"), 1 << 30},
		{a.m.missing.WithLabelValues(node, "vg1"), 1},
		{a.m.quarantinedTotal.WithLabelValues(node, "fast", "vg1", "success"), 1},
		{a.m.quarantinedTotal.WithLabelValues(node, "fast", "vg1", "error"), 1},
		{a.m.removed.WithLabelValues(node, "fast", "vg1", "success"), 0},
		{a.m.lastRun.WithLabelValues(node, "error"), float64(t0.Add(grace).Unix())},
	})

	// A finding is announced once, not every pass; the quarantine waits
	// for its own grace period.
	a.Pass(ctx, t0.Add(2*grace), pvs)
	for len(events.Events) > 0 {
		t.Errorf("event repeated on a later pass: %q", <-events.Events)
	}
	if got := testutil.ToFloat64(a.m.quarantinedTotal.WithLabelValues(node, "fast", "vg1", "error")); got != 2 {
		t.Errorf("failed quarantines %v, want 2 (retried on the next pass)", got)
	}
	if len(*removed) != 0 {
		t.Errorf("removed %v before the removal grace period", *removed)
	}

	// The removal grace period after the quarantine, it is removed.
	got = passEvents(ctx, a, events, t0.Add(grace+removal), pvs)
	checkEvents(t, got, []string{"Normal OrphanedVolumeRemoved removed orphaned LV vg1/carve-orphan-orphan (LV vg1/carve-orphan before its quarantine"})
	if !slices.Equal(*removed, []string{node + ":vg1/carve-orphan-orphan"}) {
		t.Errorf("removed %v", *removed)
	}
	checkGauges(t, []gauge{
		{a.m.quarantined.WithLabelValues(node, "fast", "vg1"), 0},
		{a.m.removed.WithLabelValues(node, "fast", "vg1", "success"), 1},
		{a.m.orphans.WithLabelValues(node, "slow", "vg1"), 1}, // carve-foreign, never touched
	})
}

type gauge struct {
	g     prometheus.Collector
	value float64
}

func checkGauges(t *testing.T, gauges []gauge) {
	t.Helper()
	for _, c := range gauges {
		if got := testutil.ToFloat64(c.g); got != c.value {
			t.Errorf("%v: %v, want %v", c.g, got, c.value)
		}
	}
}

// passEvents runs a's pass at now and takes the events it recorded off
// events.
func passEvents(ctx context.Context, a *Auditor, events *record.FakeRecorder, now time.Time, pvs []PV) []string {
	a.Pass(ctx, now, pvs)
	return recorded(events)
}

// recorded takes the events recorded so far off events.
func recorded(events *record.FakeRecorder) []string {
	var got []string
	for len(events.Events) > 0 {
		got = append(got, <-events.Events)
	}
	return got
}

func checkEvents(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("events:\n%s\nwant %d starting with:\n%s", strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("event %d: %q, want it to start with %q", i, got[i], want[i])
		}
	}
}

// TestPassQuarantineClaimed: a PV re-made by hand with the old handle of
// a quarantined orphan keeps it past the removal grace period, is not
// reported as missing data, and is told how to restore it; an orphan whose
// quarantine fails stays reported.
func TestPassQuarantineClaimed(t *testing.T) {
	const grace, removal = time.Minute, time.Hour
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	q := LV{VolumeGroup: "vg1", Name: "carve-orphan-a", Class: "fast", Size: 1, VolumeName: "pvc-a", Claim: "ns/a",
		OrphanOf: "carve-a", OrphanedAt: t0.Add(-2 * removal)}
	inv := &Inventory{Classes: []Class{{"fast", "vg1"}}, LVs: []LV{q, {VolumeGroup: "vg1", Name: "carve-b", Class: "fast", Size: 1, VolumeName: "pvc-b", Claim: "ns/b"}}}
	nodes := &fakeNodes{names: []string{node}, inv: map[string]*Inventory{node: inv},
		quarantine: func(context.Context, string, string, string, time.Time) (string, error) {
			return "", status.Error(codes.FailedPrecondition, "LV vg1/carve-b is open")
		}}
	var removed []string
	nodes.remove = func(_ context.Context, _, vg, name, _ string) error {
		removed = append(removed, vg+"/"+name)
		return nil
	}
	events := record.NewFakeRecorder(100)
	a := New(Config{Driver: testDriver, TopologyKey: testKey, Client: fake.NewClientset(), Nodes: nodes, Grace: grace, RemovalGrace: removal,
		Interval: time.Second, Registerer: prometheus.NewPedanticRegistry(), Events: events, RemoveOrphans: true})
	pvs := []PV{{Name: "pv-by-hand", Handle: "vg1/carve-a", Node: node}}
	for _, at := range []time.Duration{0, grace, 2 * grace} {
		a.Pass(context.Background(), t0.Add(at), pvs)
	}
	got := recorded(events)
	checkEvents(t, got, []string{
		"Warning QuarantinedVolumeClaimed PersistentVolume pv-by-hand names LV vg1/carve-a, which carve quarantined as orphan vg1/carve-orphan-a", // on the Node
		"Warning QuarantinedVolumeClaimed PersistentVolume pv-by-hand names LV vg1/carve-a",                                                       // on the PV
		"Warning OrphanedVolume LV vg1/carve-b",
	})
	if !strings.Contains(got[0], "lvrename vg1 carve-orphan-a carve-a") {
		t.Errorf("no restore command in %q", got[0])
	}
	if len(removed) != 0 {
		t.Errorf("removed %v: a PV names it", removed)
	}
	checkGauges(t, []gauge{
		{a.m.missing.WithLabelValues(node, "vg1"), 0},
		{a.m.quarantined.WithLabelValues(node, "fast", "vg1"), 1},
		{a.m.orphans.WithLabelValues(node, "fast", "vg1"), 1}, // carve-b: its quarantine failed
		{a.m.quarantinedTotal.WithLabelValues(node, "fast", "vg1", "error"), 2},
	})
}

// TestPassReportsOnly: without Remove nothing is removed, and the gauges
// hold every orphan.
func TestPassReportsOnly(t *testing.T) {
	t0 := time.Now()
	inv := &Inventory{Classes: []Class{{"fast", "vg1"}}, LVs: []LV{{VolumeGroup: "vg1", Name: "carve-a", Class: "fast", Size: 5, VolumeName: "pvc-a"}}}
	reg := prometheus.NewPedanticRegistry()
	removals := 0
	nodes := &fakeNodes{names: []string{node}, inv: map[string]*Inventory{node: inv},
		quarantine: func(context.Context, string, string, string, time.Time) (string, error) { removals++; return "", nil },
		remove:     func(context.Context, string, string, string, string) error { removals++; return nil }}
	a := New(Config{Driver: testDriver, TopologyKey: testKey, Client: fake.NewClientset(), Nodes: nodes,
		Grace: time.Second, Interval: time.Second, Registerer: reg, Events: record.NewFakeRecorder(10)})
	a.Pass(context.Background(), t0, nil)
	a.Pass(context.Background(), t0.Add(time.Second), nil)
	if got := testutil.ToFloat64(a.m.orphanBytes.WithLabelValues(node, "fast", "vg1")); got != 5 {
		t.Errorf("orphaned bytes %v, want 5", got)
	}
	if got := testutil.ToFloat64(a.m.lastRun.WithLabelValues(node, "success")); got == 0 {
		t.Error("no successful audit recorded")
	}
	if removals != 0 {
		t.Errorf("%d removals without RemoveOrphans", removals)
	}
}

// TestPassPerNode: each connected node is audited against the PVs with
// its own clocks and series; a busy LV is not judged; a node whose
// inventory cannot be read keeps its clocks and shows an error; a node
// that disconnects loses its clocks and its series.
func TestPassPerNode(t *testing.T) {
	const grace = time.Minute
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	lv := func(name string) LV {
		return LV{VolumeGroup: "vg1", Name: "carve-" + name, Class: "fast", Size: 1, VolumeName: "pvc-" + name}
	}
	classes := []Class{{"fast", "vg1"}}
	invA := &Inventory{Classes: classes, LVs: []LV{lv("a"), lv("busy")}, Busy: []string{"carve-busy", "carve-creating"}}
	invB := &Inventory{Classes: classes, LVs: []LV{lv("b")}}
	nodes := &fakeNodes{names: []string{node, "node-b"}, inv: map[string]*Inventory{node: invA, "node-b": invB}}
	events := record.NewFakeRecorder(100)
	reg := prometheus.NewPedanticRegistry()
	a := New(Config{Driver: testDriver, TopologyKey: testKey, Client: fake.NewClientset(), Nodes: nodes,
		Grace: grace, Interval: time.Second, Registerer: reg, Events: events})
	pvs := []PV{
		{Name: "pvc-creating", Handle: "vg1/carve-creating", Node: node}, // its LV is being made: not missing
		{Name: "pvc-lost-b", Handle: "vg1/carve-lost-b", Node: "node-b"},
	}
	ctx := context.Background()
	a.Pass(ctx, t0, pvs)
	// node-b's agent cannot answer for one pass: its clocks run on.
	delete(nodes.inv, "node-b")
	a.Pass(ctx, t0.Add(grace/2), pvs)
	if got := testutil.ToFloat64(a.m.lastRun.WithLabelValues("node-b", "error")); got != float64(t0.Add(grace/2).Unix()) {
		t.Errorf("node-b's error timestamp %v", got)
	}
	nodes.inv["node-b"] = invB
	got := passEvents(ctx, a, events, t0.Add(grace), pvs)
	want := []string{
		"Warning OrphanedVolume LV vg1/carve-a",
		"Warning OrphanedVolume LV vg1/carve-b",
		"Warning VolumeAbnormal volume vg1/carve-lost-b (PersistentVolume pvc-lost-b) on node node-b is abnormal (LogicalVolumeMissing)",
		"Warning VolumeDataMissing the LV vg1/carve-lost-b of PersistentVolume pvc-lost-b is gone from node node-b's",
	}
	slices.Sort(got)
	if len(got) != len(want) {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("event %d: %q, want it to start with %q", i, got[i], want[i])
		}
	}
	for _, c := range []struct {
		g     prometheus.Collector
		value float64
	}{
		{a.m.orphans.WithLabelValues(node, "fast", "vg1"), 1},
		{a.m.orphans.WithLabelValues("node-b", "fast", "vg1"), 1},
		{a.m.missing.WithLabelValues(node, "vg1"), 0},
		{a.m.missing.WithLabelValues("node-b", "vg1"), 1},
	} {
		if got := testutil.ToFloat64(c.g); got != c.value {
			t.Errorf("%v: %v, want %v", c.g, got, c.value)
		}
	}

	// node-b disconnects: its series go; when it is back, its clocks
	// start anew.
	nodes.names = []string{node}
	a.Pass(ctx, t0.Add(2*grace), pvs)
	if n := testutil.CollectAndCount(a.m.orphans, "carve_orphaned_volumes"); n != 1 {
		t.Errorf("%d orphan series after node-b left, want node-a's only", n)
	}
	nodes.names = []string{node, "node-b"}
	a.Pass(ctx, t0.Add(3*grace), pvs)
	if got := testutil.ToFloat64(a.m.orphans.WithLabelValues("node-b", "fast", "vg1")); got != 0 {
		t.Errorf("node-b's orphans right after it reconnected: %v, want 0 (its clocks start anew)", got)
	}
}
