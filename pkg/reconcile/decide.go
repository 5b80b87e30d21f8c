// Package reconcile is the controller's audit of the nodes' volumes: for
// each node whose agent is connected, it compares the node's carve LVs
// (its agent's inventory, over the node channel) with the
// PersistentVolumes of carve's driver and finds LVs no PV points at
// (orphans: a claim deleted while its volume was being made, a PV deleted
// by hand) and PVs pinned to the node whose LV is gone (missing data: a
// disk replaced, a volume group made anew). It reports both (metrics,
// Events, log lines) and removes an orphan, through the node's agent, only
// when asked to and only after a grace period.
package reconcile

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
	// when its tags do not name one.
	Claim string
}

// ID is the LV's volume ID, "<volume group>/<name>": the PV's volumeHandle.
func (l LV) ID() string { return l.VolumeGroup + "/" + l.Name }

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
	grace        time.Duration
	orphanSince  map[string]time.Time // LV ID
	missingSince map[string]time.Time // PV name
}

// NewDecider returns a Decider with the grace period grace.
func NewDecider(grace time.Duration) *Decider {
	return &Decider{grace: grace, orphanSince: map[string]time.Time{}, missingSince: map[string]time.Time{}}
}

// Decide runs one pass. An LV is an orphan when, in every pass for at
// least the grace period, no PV had its handle or its volume name and no
// operation on it was in flight: a volume being created has no PV until
// CreateVolume returns and csi-provisioner writes it, and the grace period
// covers that gap (a create in flight restarts the clock). A restarted
// audit (a node agent that reconnected, a new leader) starts every clock
// anew, so it reports late, never early. A PV misses its LV when it is
// pinned to the node, is not going away, its volume group was read, and
// its LV has been absent for the grace period.
func (d *Decider) Decide(in Input) (orphans []Orphan, missing []Missing) {
	handles := make(map[string]bool, len(in.PVs))
	names := make(map[string]bool, len(in.PVs))
	for _, pv := range in.PVs {
		handles[pv.Handle] = true
		names[pv.Name] = true
	}
	seenOrphan := map[string]bool{}
	lvs := map[string]bool{}
	for _, lv := range in.LVs {
		id := lv.ID()
		lvs[id] = true
		if handles[id] || lv.VolumeName != "" && names[lv.VolumeName] || in.Busy != nil && in.Busy(lv.Name) {
			continue
		}
		seenOrphan[id] = true
		since, ok := d.orphanSince[id]
		if !ok {
			since = in.Now
			d.orphanSince[id] = since
		}
		if in.Now.Sub(since) >= d.grace {
			orphans = append(orphans, Orphan{LV: lv, Since: since})
		}
	}
	forget(d.orphanSince, seenOrphan)

	seenMissing := map[string]bool{}
	for _, pv := range in.PVs {
		if pv.Node != in.Node || pv.Going || lvs[pv.Handle] {
			continue
		}
		vg, name, ok := strings.Cut(pv.Handle, "/")
		if !ok || in.Readable == nil || !in.Readable(vg) || in.Busy != nil && in.Busy(name) {
			continue
		}
		seenMissing[pv.Name] = true
		since, ok := d.missingSince[pv.Name]
		if !ok {
			since = in.Now
			d.missingSince[pv.Name] = since
		}
		if in.Now.Sub(since) >= d.grace {
			missing = append(missing, Missing{PV: pv, Since: since})
		}
	}
	forget(d.missingSince, seenMissing)
	slices.SortFunc(orphans, func(a, b Orphan) int { return strings.Compare(a.ID(), b.ID()) })
	slices.SortFunc(missing, func(a, b Missing) int { return strings.Compare(a.Name, b.Name) })
	return orphans, missing
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
