package audit

import (
	"maps"
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

// pass is one audit pass of a decide test: when, after the test's start,
// the LVs and PVs it sees, and the LVs an operation works on.
type pass struct {
	at   time.Duration
	lvs  []LV
	pvs  []PV
	busy []string
}

// decidePasses runs a Decider of grace and removal over passes on node,
// where vg1 alone is readable, from t0 on; it returns what the last pass
// found.
func decidePasses(grace, removal time.Duration, t0 time.Time, passes []pass) Findings {
	d := NewDecider(grace, removal)
	var f Findings
	for _, p := range passes {
		f = d.Decide(Input{Now: t0.Add(p.at), LVs: p.lvs, PVs: p.pvs, Node: node, Readable: func(vg string) bool { return vg == "vg1" },
			Busy: func(lv string) bool { return slices.Contains(p.busy, lv) }})
	}
	return f
}

// orphansAndMissing are the IDs of f's orphans and the names of its
// missing PVs.
func orphansAndMissing(f Findings) (orphans, missing []string) {
	for _, o := range f.Orphans {
		orphans = append(orphans, o.ID())
	}
	for _, m := range f.Missing {
		missing = append(missing, m.Name)
	}
	return orphans, missing
}

// TestDecide runs passes at the given offsets from t0 and checks what the
// last one reports.
func TestDecide(t *testing.T) {
	const grace = 10 * time.Minute
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
		{name: "the target of a move in flight keeps it, by volume name (before its CreateVolume answered)",
			passes: []pass{{0, []LV{lvOf("t")}, []PV{{Name: "pvc-a", Handle: "vg1/carve-a", Node: "node-b", MoveTarget: "pvc-t"}}, nil},
				{grace, []LV{lvOf("t")}, []PV{{Name: "pvc-a", Handle: "vg1/carve-a", Node: "node-b", MoveTarget: "pvc-t"}}, nil}}},
		{name: "the target of a move in flight keeps it, by handle",
			passes: []pass{{0, []LV{{VolumeGroup: "vg1", Name: "carve-t", Claim: "ns/a"}}, []PV{{Name: "pvc-a", Handle: "vg1/carve-a", Node: "node-b", MoveTargetHandle: "vg1/carve-t"}}, nil},
				{grace, []LV{{VolumeGroup: "vg1", Name: "carve-t", Claim: "ns/a"}}, []PV{{Name: "pvc-a", Handle: "vg1/carve-a", Node: "node-b", MoveTargetHandle: "vg1/carve-t"}}, nil}}},
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
			gotO, gotM := orphansAndMissing(decidePasses(grace, 7*24*time.Hour, t0, tc.passes))
			if !slices.Equal(gotO, tc.wantOrphans) {
				t.Errorf("orphans %v, want %v", gotO, tc.wantOrphans)
			}
			if !slices.Equal(gotM, tc.wantMissing) {
				t.Errorf("missing %v, want %v", gotM, tc.wantMissing)
			}
		})
	}
}

// quarantinedOf is lvOf(name) after its quarantine at at (zero: no time
// tag).
func quarantinedOf(name string, at time.Time) LV {
	lv := lvOf(name)
	lv.OrphanOf, lv.Name, lv.OrphanedAt = lv.Name, "carve-orphan-"+name, at
	return lv
}

// TestDecideQuarantined: a quarantined orphan is removable only after the
// removal grace period from its quarantine (its tag; the first sighting
// when it has none), while no PV names it and nothing works on it; the
// PV of its old handle misses no data.
func TestDecideQuarantined(t *testing.T) {
	const grace, removal = 10 * time.Minute, 7 * 24 * time.Hour
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := t0.Add(-removal) // quarantined a removal grace before t0
	tests := []struct {
		name          string
		passes        []pass
		wantRemovable []string // LV IDs
		wantClaimedBy map[string]string
		wantMissing   []string
		wantOrphans   []string
	}{
		{name: "removable once the removal grace has passed since its tag (a new leader does not restart it)",
			passes:        []pass{{0, []LV{quarantinedOf("a", at)}, nil, nil}},
			wantRemovable: []string{"vg1/carve-orphan-a"}},
		{name: "not before",
			passes: []pass{{0, []LV{quarantinedOf("a", at.Add(time.Second))}, nil, nil}}},
		{name: "a quarantined orphan is no orphan again",
			passes: []pass{{0, []LV{quarantinedOf("a", t0)}, nil, nil}, {grace, []LV{quarantinedOf("a", t0)}, nil, nil}}},
		{name: "without a time tag the clock starts when first seen",
			passes: []pass{{0, []LV{quarantinedOf("a", time.Time{})}, nil, nil}, {removal - time.Second, []LV{quarantinedOf("a", time.Time{})}, nil, nil}}},
		{name: "without a time tag, removable a removal grace after first seen",
			passes:        []pass{{0, []LV{quarantinedOf("a", time.Time{})}, nil, nil}, {removal, []LV{quarantinedOf("a", time.Time{})}, nil, nil}},
			wantRemovable: []string{"vg1/carve-orphan-a"}},
		{name: "a PV re-made with its old handle keeps it, and misses no data",
			passes:        []pass{{0, []LV{quarantinedOf("a", at)}, []PV{{Name: "pv-by-hand", Handle: "vg1/carve-a", Node: node}}, nil}, {grace, []LV{quarantinedOf("a", at)}, []PV{{Name: "pv-by-hand", Handle: "vg1/carve-a", Node: node}}, nil}},
			wantClaimedBy: map[string]string{"vg1/carve-orphan-a": "pv-by-hand"}},
		{name: "a PV naming the quarantine keeps it",
			passes:        []pass{{0, []LV{quarantinedOf("a", at)}, []PV{{Name: "pv-q", Handle: "vg1/carve-orphan-a", Node: node}}, nil}},
			wantClaimedBy: map[string]string{"vg1/carve-orphan-a": "pv-q"}},
		{name: "a PV of its volume name keeps it",
			passes:        []pass{{0, []LV{quarantinedOf("a", at)}, []PV{{Name: "pvc-a", Handle: "other/x", Node: node}}, nil}},
			wantClaimedBy: map[string]string{"vg1/carve-orphan-a": "pvc-a"}},
		{name: "a volume made anew under its old name owns the old handle's PV: the quarantine is not claimed",
			passes:        []pass{{0, []LV{quarantinedOf("a", at), lvOf("a")}, []PV{pvOf("a", node)}, nil}},
			wantRemovable: []string{"vg1/carve-orphan-a"}},
		{name: "an operation in flight keeps it this pass",
			passes: []pass{{0, []LV{quarantinedOf("a", at)}, nil, []string{"carve-orphan-a"}}}},
		{name: "PVs of other volumes do not keep it",
			passes:        []pass{{0, []LV{quarantinedOf("a", at), lvOf("b")}, []PV{pvOf("b", node)}, nil}},
			wantRemovable: []string{"vg1/carve-orphan-a"}},
		{name: "renamed back (no OrphanOf): a volume like any other",
			passes:      []pass{{0, []LV{lvOf("a")}, nil, nil}, {grace, []LV{lvOf("a")}, nil, nil}},
			wantOrphans: []string{"vg1/carve-a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := decidePasses(grace, removal, t0, tc.passes)
			orphans, missing := orphansAndMissing(f)
			var removable []string
			claimed := map[string]string{}
			for _, q := range f.Quarantined {
				if q.Removable {
					removable = append(removable, q.ID())
				}
				if q.ClaimedBy != "" {
					claimed[q.ID()] = q.ClaimedBy
				}
			}
			if !slices.Equal(removable, tc.wantRemovable) {
				t.Errorf("removable %v, want %v", removable, tc.wantRemovable)
			}
			if !maps.Equal(claimed, tc.wantClaimedBy) {
				t.Errorf("claimed %v, want %v", claimed, tc.wantClaimedBy)
			}
			if !slices.Equal(missing, tc.wantMissing) {
				t.Errorf("missing %v, want %v", missing, tc.wantMissing)
			}
			if !slices.Equal(orphans, tc.wantOrphans) {
				t.Errorf("orphans %v, want %v", orphans, tc.wantOrphans)
			}
		})
	}
}
