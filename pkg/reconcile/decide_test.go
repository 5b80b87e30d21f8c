package reconcile

import (
	"slices"
	"testing"
	"time"
)

const node = "node-a"

func lvOf(name string) LV {
	return LV{VolumeGroup: "vg1", Name: "carve-" + name, Class: "fast", Size: 1 << 30, VolumeName: "pvc-" + name, Claim: "ns/" + name}
}

func pvOf(name, onNode string) PV {
	return PV{Name: "pvc-" + name, Handle: "vg1/carve-" + name, Node: onNode, Claim: "ns/" + name}
}

// TestDecide runs passes at the given offsets from t0 and checks what the
// last one reports.
func TestDecide(t *testing.T) {
	const grace = 10 * time.Minute
	readable := func(vg string) bool { return vg == "vg1" }
	type pass struct {
		at   time.Duration
		lvs  []LV
		pvs  []PV
		busy []string
	}
	tests := []struct {
		name        string
		passes      []pass
		wantOrphans []string // LV IDs
		wantMissing []string // PV names
	}{
		{name: "an LV with its PV is no orphan",
			passes: []pass{{0, []LV{lvOf("a")}, []PV{pvOf("a", node)}, nil}, {grace, []LV{lvOf("a")}, []PV{pvOf("a", node)}, nil}}},
		{name: "an LV without a PV for the whole grace period is an orphan",
			passes:      []pass{{0, []LV{lvOf("a")}, nil, nil}, {grace, []LV{lvOf("a")}, nil, nil}},
			wantOrphans: []string{"vg1/carve-a"}},
		{name: "not before the grace period",
			passes: []pass{{0, []LV{lvOf("a")}, nil, nil}, {grace - time.Second, []LV{lvOf("a")}, nil, nil}}},
		{name: "a new LV seen once is no orphan (in-flight provisioning)",
			passes: []pass{{grace * 3, []LV{lvOf("a")}, nil, nil}}},
		{name: "a create in flight restarts the clock",
			passes: []pass{{0, []LV{lvOf("a")}, nil, nil}, {grace / 2, []LV{lvOf("a")}, nil, []string{"carve-a"}},
				{grace, []LV{lvOf("a")}, nil, nil}, {grace + grace/2, []LV{lvOf("a")}, nil, nil}}},
		{name: "the clock runs on after the create ends",
			passes: []pass{{0, []LV{lvOf("a")}, nil, []string{"carve-a"}}, {time.Second, []LV{lvOf("a")}, nil, nil},
				{grace + time.Second, []LV{lvOf("a")}, nil, nil}},
			wantOrphans: []string{"vg1/carve-a"}},
		{name: "a PV that appears within the grace period stops the clock",
			passes: []pass{{0, []LV{lvOf("a")}, nil, nil}, {grace / 2, []LV{lvOf("a")}, []PV{pvOf("a", node)}, nil},
				{grace, []LV{lvOf("a")}, nil, nil}}},
		{name: "a PV of the volume's name with another handle keeps it (a PV of carve by name)",
			passes: []pass{{0, []LV{lvOf("a")}, []PV{{Name: "pvc-a", Handle: "other/x", Node: node}}, nil},
				{grace, []LV{lvOf("a")}, []PV{{Name: "pvc-a", Handle: "other/x", Node: node}}, nil}}},
		{name: "a PV on another node with the handle keeps it",
			passes: []pass{{0, []LV{lvOf("a")}, []PV{pvOf("a", "node-b")}, nil}, {grace, []LV{lvOf("a")}, []PV{pvOf("a", "node-b")}, nil}}},
		{name: "PVs of other volumes do not keep an LV",
			passes:      []pass{{0, []LV{lvOf("a"), lvOf("b")}, []PV{pvOf("b", node)}, nil}, {grace, []LV{lvOf("a"), lvOf("b")}, []PV{pvOf("b", node)}, nil}},
			wantOrphans: []string{"vg1/carve-a"}},
		{name: "an LV gone between passes is forgotten",
			passes: []pass{{0, []LV{lvOf("a")}, nil, nil}, {grace / 2, nil, nil, nil}, {grace, []LV{lvOf("a")}, nil, nil}}},
		{name: "a PV of this node without its LV for the grace period is missing data",
			passes:      []pass{{0, nil, []PV{pvOf("a", node)}, nil}, {grace, nil, []PV{pvOf("a", node)}, nil}},
			wantMissing: []string{"pvc-a"}},
		{name: "missing data not before the grace period",
			passes: []pass{{0, nil, []PV{pvOf("a", node)}, nil}, {grace - time.Second, nil, []PV{pvOf("a", node)}, nil}}},
		{name: "a PV of another node is not this node's to judge",
			passes: []pass{{0, nil, []PV{pvOf("a", "node-b")}, nil}, {grace, nil, []PV{pvOf("a", "node-b")}, nil}}},
		{name: "a PV going away may lose its LV first",
			passes: []pass{{0, nil, []PV{{Name: "pvc-a", Handle: "vg1/carve-a", Node: node, Going: true}}, nil},
				{grace, nil, []PV{{Name: "pvc-a", Handle: "vg1/carve-a", Node: node, Going: true}}, nil}}},
		{name: "a PV whose volume group was not read is not judged",
			passes: []pass{{0, nil, []PV{{Name: "pvc-a", Handle: "vg2/carve-a", Node: node}}, nil},
				{grace, nil, []PV{{Name: "pvc-a", Handle: "vg2/carve-a", Node: node}}, nil}}},
		{name: "a PV whose LV comes back is not missing",
			passes: []pass{{0, nil, []PV{pvOf("a", node)}, nil}, {grace / 2, []LV{lvOf("a")}, []PV{pvOf("a", node)}, nil},
				{grace, nil, []PV{pvOf("a", node)}, nil}}},
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecider(grace)
			var orphans []Orphan
			var missing []Missing
			for _, p := range tc.passes {
				orphans, missing = d.Decide(Input{Now: t0.Add(p.at), LVs: p.lvs, PVs: p.pvs, Node: node, Readable: readable,
					Busy: func(lv string) bool { return slices.Contains(p.busy, lv) }})
			}
			var gotO, gotM []string
			for _, o := range orphans {
				gotO = append(gotO, o.ID())
			}
			for _, m := range missing {
				gotM = append(gotM, m.Name)
			}
			if !slices.Equal(gotO, tc.wantOrphans) {
				t.Errorf("orphans %v, want %v", gotO, tc.wantOrphans)
			}
			if !slices.Equal(gotM, tc.wantMissing) {
				t.Errorf("missing %v, want %v", gotM, tc.wantMissing)
			}
		})
	}
}
