package audit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// TestPassVolumeHealth: a volume its node reports abnormal gets a Warning
// VolumeAbnormal on its claim (on the PV when unbound) once per set of
// reasons, a Normal VolumeRecovered once when it is healthy again, and
// counts in carve_volumes_abnormal meanwhile. An inactive LV is no
// problem (the node activates it for a pod); nothing is said while the
// volume group cannot be read, nor of a volume without a PV.
func TestPassVolumeHealth(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	inv := &Inventory{Classes: []Class{{"thin", "vg1"}, {"fast", "vg2"}}, LVs: []LV{
		{VolumeGroup: "vg1", Name: "carve-db", Class: "thin", VolumeName: "pv-db", Claim: "ns/db"},
		{VolumeGroup: "vg1", Name: "carve-idle", Class: "thin", VolumeName: "pv-idle", Claim: "ns/idle"},
		{VolumeGroup: "vg2", Name: "carve-static", Class: "fast", VolumeName: "pv-static"},
	}}
	nodes := &fakeNodes{names: []string{node}, inv: map[string]*Inventory{node: inv}}
	events := record.NewFakeRecorder(100)
	events.IncludeObject = true
	a := New(Config{Driver: testDriver, TopologyKey: testKey, Client: fake.NewClientset(), Nodes: nodes, Grace: time.Hour,
		Interval: time.Second, Registerer: prometheus.NewPedanticRegistry(), Events: events})
	pvs := []PV{
		{Name: "pv-db", Handle: "vg1/carve-db", Node: node, Claim: "ns/db", ClaimUID: "uid-db"},
		{Name: "pv-idle", Handle: "vg1/carve-idle", Node: node, Claim: "ns/idle", ClaimUID: "uid-idle"},
		{Name: "pv-static", Handle: "vg2/carve-static", Node: node},
	}
	full := func(pct string) Problem {
		return Problem{Status: "DEGRADED", Reason: "ThinPoolFull", Message: "thin pool pool0 is " + pct + "% full (data)"}
	}
	inactive := Problem{Status: "INACCESSIBLE", Reason: healthInactive, Message: "the LV is not active"}
	steps := []struct {
		name   string
		health []VolumeHealth
		// unreadable makes vg1 unreadable for the pass.
		unreadable bool
		want       []string // events, in order
		abnormal   map[string]float64
	}{
		{name: "pool nearly full, a PV missing, an LV inactive",
			health: []VolumeHealth{
				{ID: "vg1/carve-db", Problems: []Problem{full("96.0"), inactive}},
				{ID: "vg1/carve-idle", Problems: []Problem{inactive}},
				{ID: "vg2/carve-static", Problems: []Problem{{Status: "INACCESSIBLE", Reason: "PhysicalVolumeMissing", Message: "a physical volume of the LV is missing"}}},
				{ID: "vg1/carve-no-pv", Problems: []Problem{full("96.0")}},
			},
			want: []string{
				"Warning VolumeAbnormal volume vg1/carve-db (PersistentVolume pv-db) on node node-a is abnormal (ThinPoolFull): thin pool pool0 is 96.0% full (data).",
				"Warning VolumeAbnormal volume vg2/carve-static (PersistentVolume pv-static) on node node-a is abnormal (PhysicalVolumeMissing): a physical volume of the LV is missing.",
			},
			abnormal: map[string]float64{"vg1": 1, "vg2": 1}},
		{name: "the same problems, other numbers: said once",
			health: []VolumeHealth{
				{ID: "vg1/carve-db", Problems: []Problem{full("97.5")}},
				{ID: "vg2/carve-static", Problems: []Problem{{Status: "INACCESSIBLE", Reason: "PhysicalVolumeMissing", Message: "a physical volume of the LV is missing"}}},
			},
			abnormal: map[string]float64{"vg1": 1, "vg2": 1}},
		{name: "another problem: said again",
			health: []VolumeHealth{
				{ID: "vg1/carve-db", Problems: []Problem{full("97.5"), {Status: "INACCESSIBLE", Reason: "LogicalVolumeFailed", Message: "LVM reports the LV as failed"}}},
			},
			want: []string{
				"Warning VolumeAbnormal volume vg1/carve-db (PersistentVolume pv-db) on node node-a is abnormal (LogicalVolumeFailed,ThinPoolFull): thin pool pool0 is 97.5% full (data); LVM reports the LV as failed.",
				"Normal VolumeRecovered volume vg2/carve-static (PersistentVolume pv-static) on node node-a is healthy again (it was abnormal: PhysicalVolumeMissing)",
			},
			abnormal: map[string]float64{"vg1": 1, "vg2": 0}},
		{name: "its volume group unreadable: nothing said", unreadable: true,
			abnormal: map[string]float64{"vg1": 1, "vg2": 0}},
		{name: "healthy again: said once",
			want: []string{
				"Normal VolumeRecovered volume vg1/carve-db (PersistentVolume pv-db) on node node-a is healthy again (it was abnormal: LogicalVolumeFailed,ThinPoolFull)",
			},
			abnormal: map[string]float64{"vg1": 0, "vg2": 0}},
		{name: "still healthy", abnormal: map[string]float64{"vg1": 0, "vg2": 0}},
	}
	for i, st := range steps {
		nodes.health = map[string][]VolumeHealth{node: st.health}
		inv.Unreadable = nil
		if st.unreadable {
			inv.Unreadable = []string{"vg1"}
		}
		got := passEvents(context.Background(), a, events, t0.Add(time.Duration(i)*time.Minute), pvs)
		if len(got) != len(st.want) {
			t.Fatalf("%s: events\n%s\nwant\n%s", st.name, strings.Join(got, "\n"), strings.Join(st.want, "\n"))
		}
		for j, w := range st.want {
			if !strings.HasPrefix(got[j], w) {
				t.Errorf("%s: event %q, want it to start with %q", st.name, got[j], w)
			}
		}
		for _, e := range got {
			// A bound PV's Events go to its claim, an unbound one's to it.
			onClaim := strings.HasSuffix(e, "involvedObject{kind=PersistentVolumeClaim,apiVersion=v1}")
			if strings.Contains(e, "(PersistentVolume pv-db)") != onClaim {
				t.Errorf("%s: event on the wrong object: %q", st.name, e)
			}
		}
		for vg, want := range st.abnormal {
			checkGauges(t, []gauge{{a.m.abnormal.WithLabelValues(node, vg), want}})
		}
	}
}

func TestHealthRef(t *testing.T) {
	for _, tt := range []struct {
		pv   PV
		want corev1.ObjectReference
	}{
		{PV{Name: "pv-1", Claim: "ns/db", ClaimUID: "uid-1"},
			corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "db", UID: "uid-1", APIVersion: "v1"}},
		{PV{Name: "pv-2"}, corev1.ObjectReference{Kind: "PersistentVolume", Name: "pv-2", APIVersion: "v1"}},
	} {
		if got := healthRef(tt.pv); *got != tt.want {
			t.Errorf("healthRef(%+v) = %+v, want %+v", tt.pv, *got, tt.want)
		}
	}
}
