// Package audit is the controller's audit of the nodes' volumes: for each
// node whose agent is connected, it compares the agent's inventory of carve
// LVs with carve's PersistentVolumes, and reports (metrics, Events, logs) LVs
// no PV points at (orphans) and PVs pinned to the node whose LV is gone.
// Only with --remove-orphans does it act on an orphan, in two steps each
// after a grace period: quarantine (renamed carve-orphan-<hex>, data kept),
// then removal if it stays unclaimed. An LV whose tags name no claim is never
// touched (docs/operations.md, "Orphaned volumes").
package audit

import (
	"slices"
	"strings"
	"time"
)

// LV is one of carve's LVs on a node, as the decision sees it.
type LV struct {
	VolumeGroup, Name string
	// Class is the device class from the LV's tags.
	Class string
	Size  uint64
	// VolumeName is the CSI volume name from the LV's tags (under
	// Kubernetes, the PV's name); empty when the tags do not carry it
	// whole.
	VolumeName string
	// Claim is "<namespace>/<name>" of the PVC the LV was made for, empty
	// when its tags do not name one: such an LV is never quarantined or
	// removed, only reported.
	Claim string
	// OrphanOf is set on an orphan the audit quarantined (renamed
	// carve-orphan-<hex> and deactivated): the LV name it had before.
	OrphanOf string
	// OrphanedAt is when it was quarantined (its tag); zero when unknown.
	OrphanedAt time.Time
}

// ID is the LV's volume ID, "<volume group>/<name>": the PV's volumeHandle.
func (l LV) ID() string { return l.VolumeGroup + "/" + l.Name }

// OriginalID is the volume ID a quarantined orphan had, the one its PV
// named; an LV that is not quarantined has its own ID.
func (l LV) OriginalID() string {
	if l.OrphanOf == "" {
		return l.ID()
	}
	return l.VolumeGroup + "/" + l.OrphanOf
}

// PV is a PersistentVolume of carve's driver, as the decision sees it.
type PV struct {
	Name string
	// Handle is spec.csi.volumeHandle.
	Handle string
	// Node is the node its required node affinity names on carve's
	// topology key; empty when it names none.
	Node string
	// Claim is the PVC it is bound to, "<namespace>/<name>", empty when
	// unbound; ClaimUID its UID.
	Claim    string
	ClaimUID string
	// Going is true while the PV is being deleted or released for
	// deletion: its LV may be removed before the PV is.
	Going bool
	// MoveTarget and MoveTargetHandle name the target volume of a move of
	// this PV in flight (internal/controller/mover), by CSI volume name and by ID: it has
	// no PV of its own until the move binds it, and is no orphan.
	MoveTarget, MoveTargetHandle string
}

// Orphan is an LV that no PV has pointed at for at least the grace period.
type Orphan struct {
	LV
	// Since is when the audit first saw it without a PV.
	Since time.Time
}

// Missing is a PV of this node whose LV has been absent for at least the
// grace period.
type Missing struct {
	PV
	Since time.Time
}

// Quarantined is an orphan the audit quarantined, found again.
type Quarantined struct {
	LV
	// Since is when it was quarantined (its tag), or else when the audit
	// first saw it: the second grace period runs from it.
	Since time.Time
	// Removable is true once it has been quarantined for the second grace
	// period with no PV naming it and no operation on it in flight.
	Removable bool
	// ClaimedBy names the PV that points at it (by its old handle, its
	// own, or its volume name): it is kept, whatever the time, until
	// someone restores it (lvrename) or the PV goes.
	ClaimedBy string
}

// Findings are what one pass found on a node.
type Findings struct {
	// Orphans have lacked a PV for the grace period.
	Orphans []Orphan
	// Missing are this node's PVs whose LV has been gone for the grace
	// period.
	Missing []Missing
	// Quarantined are every quarantined orphan of the node.
	Quarantined []Quarantined
}

// Input is what one audit pass compares.
type Input struct {
	// Now is the time of the pass.
	Now time.Time
	// LVs are carve's LVs (owner tag) in the volume groups this node read
	// successfully; LVs of other tools must not be in it.
	LVs []LV
	// PVs are the PVs of carve's driver, of every node: an LV with a PV
	// anywhere is no orphan.
	PVs []PV
	// Node is this node's name: only PVs pinned to it can miss their LV.
	Node string
	// Readable tells whether a volume group was read in this pass (it is
	// configured, exists or is known to be missing, and LVM could read it
	// or tell it is gone): a PV in any other volume group is not judged.
	Readable func(vg string) bool
	// Busy tells whether an operation (a CreateVolume, a DeleteVolume) on
	// the LV is in flight.
	Busy func(lvName string) bool
}

// Decider keeps, between passes, when each candidate was first seen, so
// that only what has lasted a whole grace period is reported. It is not
// safe for concurrent use; one audit loop owns it.
type Decider struct {
	grace, removalGrace time.Duration
	orphanSince         map[string]time.Time // LV ID
	missingSince        map[string]time.Time // PV name
	// quarantineSince is when a quarantined orphan without a time tag
	// (renamed by hand) was first seen.
	quarantineSince map[string]time.Time // LV ID
}

// NewDecider returns a Decider with the grace period grace (an LV without
// a PV, a PV without its LV) and removalGrace (a quarantined orphan).
func NewDecider(grace, removalGrace time.Duration) *Decider {
	return &Decider{grace: grace, removalGrace: removalGrace, orphanSince: map[string]time.Time{},
		missingSince: map[string]time.Time{}, quarantineSince: map[string]time.Time{}}
}

// Decide runs one pass. An LV is an orphan when for the whole grace period no
// PV named it (by handle, volume name or as its move's target) and no call on
// it was in flight: the grace covers a create whose PV is not written yet. A
// restarted audit starts every clock anew, so it reports late, never early. A
// PV misses its LV when it is pinned to the node, not going away, its volume
// group was read and the LV was absent for the grace period; a quarantined LV
// it names is not missing. A quarantined orphan is removable once the removal
// grace has passed since its quarantine tag, while no PV names it and no call
// on it is in flight.
func (d *Decider) Decide(in Input) Findings {
	var f Findings
	handles := make(map[string]string, len(in.PVs))
	names := make(map[string]bool, len(in.PVs))
	for _, pv := range in.PVs {
		handles[pv.Handle] = pv.Name
		names[pv.Name] = true
		if pv.MoveTarget != "" {
			names[pv.MoveTarget] = true
		}
		if pv.MoveTargetHandle != "" {
			handles[pv.MoveTargetHandle] = pv.Name
		}
	}
	busy := func(name string) bool { return in.Busy != nil && in.Busy(name) }
	present := make(map[string]bool, len(in.LVs))
	for _, lv := range in.LVs {
		present[lv.ID()] = true
	}
	seenOrphan := map[string]bool{}
	seenQuarantined := map[string]bool{}
	lvs := map[string]bool{}
	for _, lv := range in.LVs {
		id := lv.ID()
		lvs[id] = true
		if lv.OrphanOf != "" {
			lvs[lv.OriginalID()] = true
			f.Quarantined = append(f.Quarantined, d.quarantined(in.Now, lv, handles, names, busy(lv.Name), present[lv.OriginalID()], seenQuarantined))
			continue
		}
		if handles[id] != "" || lv.VolumeName != "" && names[lv.VolumeName] || busy(lv.Name) {
			continue
		}
		seenOrphan[id] = true
		since, ok := d.orphanSince[id]
		if !ok {
			since = in.Now
			d.orphanSince[id] = since
		}
		if in.Now.Sub(since) >= d.grace {
			f.Orphans = append(f.Orphans, Orphan{LV: lv, Since: since})
		}
	}
	forget(d.orphanSince, seenOrphan)
	forget(d.quarantineSince, seenQuarantined)

	seenMissing := map[string]bool{}
	for _, pv := range in.PVs {
		if pv.Node != in.Node || pv.Going || lvs[pv.Handle] {
			continue
		}
		vg, name, ok := strings.Cut(pv.Handle, "/")
		if !ok || in.Readable == nil || !in.Readable(vg) || busy(name) {
			continue
		}
		seenMissing[pv.Name] = true
		since, ok := d.missingSince[pv.Name]
		if !ok {
			since = in.Now
			d.missingSince[pv.Name] = since
		}
		if in.Now.Sub(since) >= d.grace {
			f.Missing = append(f.Missing, Missing{PV: pv, Since: since})
		}
	}
	forget(d.missingSince, seenMissing)
	slices.SortFunc(f.Orphans, func(a, b Orphan) int { return strings.Compare(a.ID(), b.ID()) })
	slices.SortFunc(f.Missing, func(a, b Missing) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(f.Quarantined, func(a, b Quarantined) int { return strings.Compare(a.ID(), b.ID()) })
	return f
}

// quarantined judges one quarantined orphan. replaced tells that an LV
// of its old name exists again (a volume made anew under that name): a PV
// of the old handle or of the volume name is that LV's, not the
// quarantine's.
func (d *Decider) quarantined(now time.Time, lv LV, handles map[string]string, names map[string]bool, busy, replaced bool, seen map[string]bool) Quarantined {
	q := Quarantined{LV: lv, Since: lv.OrphanedAt}
	switch {
	case handles[lv.ID()] != "":
		q.ClaimedBy = handles[lv.ID()]
	case replaced:
	case handles[lv.OriginalID()] != "":
		q.ClaimedBy = handles[lv.OriginalID()]
	case lv.VolumeName != "" && names[lv.VolumeName]:
		q.ClaimedBy = lv.VolumeName
	}
	if q.Since.IsZero() {
		id := lv.ID()
		seen[id] = true
		since, ok := d.quarantineSince[id]
		if !ok {
			since = now
			d.quarantineSince[id] = since
		}
		q.Since = since
	}
	q.Removable = q.ClaimedBy == "" && !busy && now.Sub(q.Since) >= d.removalGrace
	return q
}

// Reset forgets an LV's clock (after it was removed, or when its claim
// turned out to be alive).
func (d *Decider) Reset(lvID string) { delete(d.orphanSince, lvID) }

// forget drops the clocks of what this pass did not see.
func forget(since map[string]time.Time, seen map[string]bool) {
	for k := range since {
		if !seen[k] {
			delete(since, k)
		}
	}
}
