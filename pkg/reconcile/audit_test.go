package reconcile

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/carve-csi/carve/pkg/pvindex"
)

const (
	testDriver = "lvm.carve.dev"
	testKey    = "topology.carve.dev/node"
)

type fakeVolumes struct{ lvs []LV }

func (f *fakeVolumes) Volumes() []LV           { return f.lvs }
func (f *fakeVolumes) Readable(vg string) bool { return vg == "vg1" }

// fakeOrphans removes with itself; no LV is busy.
type fakeOrphans func(ctx context.Context, vg, name string) error

func (fakeOrphans) Busy(string) bool { return false }

func (f fakeOrphans) RemoveOrphan(ctx context.Context, vg, name string) error {
	return f(ctx, vg, name)
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
		o, err := pvindex.Trim(testDriver)(pv)
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
	vols := &fakeVolumes{lvs: []LV{
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
	var removed []string
	removeErr := map[string]error{"carve-reused": errors.New("lvremove failed")}
	a := New(Config{Node: node, Driver: testDriver, TopologyKey: testKey, Client: client, Volumes: vols,
		Classes: []Class{{"fast", "vg1"}, {"slow", "vg1"}}, Grace: grace, Interval: time.Second,
		Registerer: reg, Events: events, RemoveOrphans: true,
		Orphans: fakeOrphans(func(_ context.Context, vg, name string) error {
			if err := removeErr[name]; err != nil {
				return err
			}
			removed = append(removed, vg+"/"+name)
			return nil
		})})
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
	if got := testutil.ToFloat64(a.m.orphans.WithLabelValues("fast", "vg1")); got != 0 {
		t.Errorf("orphans before the grace period: %v", got)
	}

	a.Pass(ctx, t0.Add(grace), pvs)
	var got []string
	for len(events.Events) > 0 {
		got = append(got, <-events.Events)
	}
	want := []string{
		"Warning OrphanedVolume LV vg1/carve-foreign",
		"Warning OrphanedVolume LV vg1/carve-orphan",
		"Warning OrphanedVolume LV vg1/carve-reused",
		"Warning VolumeDataMissing the LV vg1/carve-lost of PersistentVolume pv-lost", // on the PV
		"Warning VolumeDataMissing the LV vg1/carve-lost of PersistentVolume pv-lost", // on the PVC
		"Normal OrphanedVolumeRemoved removed orphaned LV vg1/carve-foreign",
		"Normal OrphanedVolumeRemoved removed orphaned LV vg1/carve-orphan",
	}
	if len(got) != len(want) {
		t.Fatalf("events:\n%s\nwant %d starting with:\n%s", strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("event %d: %q, want it to start with %q", i, got[i], want[i])
		}
	}
	if !strings.Contains(got[1], "claim ns/gone") || !strings.Contains(got[1], "1073741824 bytes") {
		t.Errorf("orphan event does not name claim and size: %q", got[1])
	}
	if !slices.Equal(removed, []string{"vg1/carve-foreign", "vg1/carve-orphan"}) {
		t.Errorf("removed %v", removed)
	}
	// What removal failed for stays reported; what was removed does not.
	for _, c := range []struct {
		g     prometheus.Collector
		value float64
	}{
		{a.m.orphans.WithLabelValues("fast", "vg1"), 1},
		{a.m.orphanBytes.WithLabelValues("fast", "vg1"), 4 << 30},
		{a.m.orphans.WithLabelValues("slow", "vg1"), 0},
		{a.m.missing.WithLabelValues("vg1"), 1},
		{a.m.removed.WithLabelValues("fast", "vg1", "success"), 1},
		{a.m.removed.WithLabelValues("fast", "vg1", "error"), 1},
		{a.m.removed.WithLabelValues("slow", "vg1", "success"), 1},
		{a.m.lastRun.WithLabelValues("error"), float64(t0.Add(grace).Unix())},
	} {
		if got := testutil.ToFloat64(c.g); got != c.value {
			t.Errorf("%v: %v, want %v", c.g, got, c.value)
		}
	}

	// A finding is announced once, not every pass.
	a.Pass(ctx, t0.Add(2*grace), pvs)
	for len(events.Events) > 0 {
		t.Errorf("event repeated on a later pass: %q", <-events.Events)
	}
	if got := testutil.ToFloat64(a.m.removed.WithLabelValues("fast", "vg1", "error")); got != 2 {
		t.Errorf("failed removals %v, want 2 (retried on the next pass)", got)
	}
}

// TestPassReportsOnly: without Remove nothing is removed, and the gauges
// hold every orphan.
func TestPassReportsOnly(t *testing.T) {
	t0 := time.Now()
	vols := &fakeVolumes{lvs: []LV{{VolumeGroup: "vg1", Name: "carve-a", Class: "fast", Size: 5, VolumeName: "pvc-a"}}}
	reg := prometheus.NewPedanticRegistry()
	a := New(Config{Node: node, Driver: testDriver, TopologyKey: testKey, Client: fake.NewClientset(), Volumes: vols,
		Classes: []Class{{"fast", "vg1"}}, Grace: time.Second, Interval: time.Second, Registerer: reg, Events: record.NewFakeRecorder(10)})
	a.Pass(context.Background(), t0, nil)
	a.Pass(context.Background(), t0.Add(time.Second), nil)
	if got := testutil.ToFloat64(a.m.orphanBytes.WithLabelValues("fast", "vg1")); got != 5 {
		t.Errorf("orphaned bytes %v, want 5", got)
	}
	if got := testutil.ToFloat64(a.m.lastRun.WithLabelValues("success")); got == 0 {
		t.Error("no successful audit recorded")
	}
}
