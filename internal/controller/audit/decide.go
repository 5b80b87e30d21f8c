// Package audit compares each connected node's carve LVs with carve's PVs and reports
// orphan LVs and PVs whose LV is gone. Only with --remove-orphans does it quarantine an
// orphan, then remove it, each after a grace; an LV naming no claim is never touched
// (docs/operations.md, "Orphaned volumes").
package audit

import (
	"slices"
	"strings"
	"time"
)

// LV is one of carve's LVs on a node.
type LV struct {
	VolumeGroup, Name string
	// Class is the device class from the LV's tags.
	Class string
	Size  uint64
	// VolumeName is the CSI volume name from the tags; "" when not whole.
	VolumeName string
	// Claim is the PVC ("<namespace>/<name>") from the tags; an LV without one
	// is only reported, never touched.
	Claim string
	// OrphanOf is the LV name a quarantined orphan had.
	OrphanOf string
	// OrphanedAt is when it was quarantined; zero when unknown.
	OrphanedAt time.Time
}

// ID is the LV's volume ID, the PV's volumeHandle.
func (l LV) ID() string { return l.VolumeGroup + "/" + l.Name }

// OriginalID is the ID a quarantined orphan had, else the LV's own.
func (l LV) OriginalID() string {
	if l.OrphanOf == "" {
		return l.ID()
	}
	return l.VolumeGroup + "/" + l.OrphanOf
}

// PV is a PersistentVolume of carve's driver.
type PV struct {
	Name string
	// Handle is spec.csi.volumeHandle.
	Handle string
	// Node is the node its affinity names on carve's topology key; "" if none.
	Node string
	// Claim is the bound PVC ("<namespace>/<name>"), ClaimUID its UID.
	Claim    string
	ClaimUID string
	// Going is set while the PV is deleted or released: its LV may go first.
	Going bool
	// MoveTarget and MoveTargetHandle name a move's target volume in flight,
	// which has no PV until the move binds it and is no orphan.
	MoveTarget, MoveTargetHandle string
}

// Orphan is an LV without a PV for the grace period.
type Orphan struct {
	LV
	// Since is when the audit first saw it without a PV.
	Since time.Time
}

// Missing is a PV of this node whose LV has been absent for the grace period.
type Missing struct {
	PV
	Since time.Time
}

// Quarantined is an orphan the audit quarantined, found again.
type Quarantined struct {
	LV
	// Since is when it was quarantined (tag) or first seen; removal grace runs
	// from it.
	Since time.Time
	// Removable is set once the removal grace passed with no PV naming it and
	// nothing in flight.
	Removable bool
	// ClaimedBy names the PV pointing at it: it is kept until restored or the
	// PV goes.
	ClaimedBy string
}

// Findings are what one pass found on a node.
type Findings struct {
	// Orphans have lacked a PV for the grace period.
	Orphans []Orphan
	// Missing are this node's PVs whose LV has been gone for the grace period.
	Missing []Missing
	// Quarantined are the node's quarantined orphans.
	Quarantined []Quarantined
}

// Input is what one audit pass compares.
type Input struct {
	// Now is the time of the pass.
	Now time.Time
	// LVs are carve's LVs (owner tag) in the volume groups read successfully.
	LVs []LV
	// PVs are carve's PVs of every node: an LV with a PV anywhere is no orphan.
	PVs []PV
	// Node is this node: only PVs pinned to it can miss their LV.
	Node string
	// Readable tells whether a volume group was read this pass; PVs in other
	// volume groups are not judged.
	Readable func(vg string) bool
	// Busy tells whether a CreateVolume or DeleteVolume on the LV is in flight.
	Busy func(lvName string) bool
}

// Decider remembers when each candidate was first seen, so only what lasts
// a whole grace period is reported. Not safe for concurrent use.
type Decider struct {
	grace, removalGrace time.Duration
	orphanSince         map[string]time.Time // LV ID
	missingSince        map[string]time.Time // PV name
	// quarantineSince is when a quarantined orphan without time tag was seen.
	quarantineSince map[string]time.Time // LV ID
}

// NewDecider returns a Decider with the grace periods for orphans and
// missing LVs (grace) and quarantined orphans (removalGrace).
func NewDecider(grace, removalGrace time.Duration) *Decider {
	return &Decider{grace: grace, removalGrace: removalGrace, orphanSince: map[string]time.Time{},
		missingSince: map[string]time.Time{}, quarantineSince: map[string]time.Time{}}
}

// Decide runs one pass. An LV is an orphan when for the whole grace period
// no PV named it (handle, volume name or move target) and no call on it was
// in flight: the grace covers a create whose PV is not written yet. A PV
// misses its LV when pinned here, not going, its volume group read and the
// LV absent for the grace period. A quarantined orphan is removable once
// the removal grace passed, no PV names it and nothing is in flight.
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

// quarantined judges one quarantined orphan. replaced says an LV of its old
// name exists again: PVs of the old handle or name are that LV's.
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

// Reset forgets an LV's clock (removed, or its claim alive).
func (d *Decider) Reset(lvID string) { delete(d.orphanSince, lvID) }

func forget(since map[string]time.Time, seen map[string]bool) {
	for k := range since {
		if !seen[k] {
			delete(since, k)
		}
	}
}
