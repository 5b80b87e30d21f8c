// Package moveapi is a move of a claim to another node (internal/controller/mover) as it
// shows on Kubernetes objects: the annotations that ask for it and hold
// its state, its phases and its Events' reasons. It imports nothing but
// the standard library, so that kubectl-carve, which asks for moves and
// follows them, does not link the mover.
package moveapi

import (
	"fmt"
	"time"
)

// Annotations. AnnMoveTo is the request on the claim; the others live on
// the old PV while its move runs (pvindex keeps every annotation of the
// prefix AnnPrefix in its cache: the audit and the router read them).
const (
	AnnPrefix = "carve.dev/move-"
	// AnnMoveTo on a claim asks to move it to that node ("*": the node of
	// the claim's class with the most free capacity, not the claim's);
	// on the old PV it is the node the move goes to.
	AnnMoveTo = AnnPrefix + "to"
	// AnnPhase is the move's phase (Phase*).
	AnnPhase = AnnPrefix + "phase"
	// AnnReclaimPolicy is the old PV's reclaim policy before the move.
	AnnReclaimPolicy = AnnPrefix + "reclaim-policy"
	// AnnTarget is the CSI name of the target volume (and the new PV's name).
	AnnTarget = AnnPrefix + "target"
	// AnnTargetID is the target volume's ID, once made.
	AnnTargetID = AnnPrefix + "target-id"
	// AnnTargetContext is the target volume's volume context (JSON).
	AnnTargetContext = AnnPrefix + "target-context"
	// AnnSeed is the seed snapshot's ID, once made.
	AnnSeed = AnnPrefix + "seed"
	// AnnSeedName is the seed snapshot's CSI name: new for each move, so
	// that a target left by an earlier move to the same node (same CSI
	// name) is never taken for a copy of this move's seed.
	AnnSeedName = AnnPrefix + "seed-name"
	// AnnSeedTime is when the seed snapshot was made (RFC 3339).
	AnnSeedTime = AnnPrefix + "seed-time"
	// AnnStopped is when the workload was stopped: the claim gone, no pod
	// writing to the old volume any more (RFC 3339).
	AnnStopped = AnnPrefix + "stopped"
	// AnnSalvage on the old PV of a move parked while catching up asks to
	// bind the claim to the target as it is, the data as of the seed:
	// `kubectl carve move --salvage`. What was written between the seed
	// and the stop is lost (WritesLost).
	AnnSalvage = AnnPrefix + "salvage"
	// AnnClaim is the claim as it was before stopping (JSON).
	AnnClaim = AnnPrefix + "claim"
	// AnnPhaseSince is when the current phase started (RFC 3339).
	AnnPhaseSince = AnnPrefix + "phase-since"
	// AnnDurations are the past phases' durations ("seeding=1.5s,...").
	AnnDurations = AnnPrefix + "durations"
	// AnnBytes is what the catch-up sent.
	AnnBytes = AnnPrefix + "bytes"
	// AnnAbort on the old PV asks to roll a move back while that is
	// still possible (stopping, catching-up): `kubectl carve move --abort`.
	// On a parked move it releases the claim's name and keeps the target
	// and the seed.
	AnnAbort = AnnPrefix + "abort"
	// AnnParked is why a move is parked (PhaseParked): the old volume
	// could not be vouched for, so nothing of the move is deleted.
	AnnParked = AnnPrefix + "parked"
	// AnnParkedFrom is the phase a parked move resumes at once its old
	// volume answers again.
	AnnParkedFrom = AnnPrefix + "parked-from"
	// AnnWaiting says what the move waits for or the last failure it
	// retries: for `kubectl carve move` to show.
	AnnWaiting = AnnPrefix + "waiting"
	// AnyNode as AnnMoveTo lets carve choose the node.
	AnyNode = "*"
)

// Phases.
const (
	PhaseSeeding     = "seeding"
	PhaseStopping    = "stopping"
	PhaseCatchingUp  = "catching-up"
	PhaseBinding     = "binding"
	PhaseCleaning    = "cleaning"
	PhaseRollingBack = "rolling-back"
	// PhaseParked: the move stopped where it was because its old volume
	// is not known to be there and whole (its node does not answer, or
	// the volume is gone): the target and the seed, which may hold the
	// only copy, are kept until the node answers or an operator decides.
	PhaseParked = "parked"
)

// Event reasons, on the claim and on the old PV.
const (
	ReasonMoving     = "Moving"
	ReasonMoved      = "Moved"
	ReasonMoveFailed = "MoveFailed"
	ReasonAborted    = "MoveAborted"
	ReasonRolledBack = "MoveRolledBack"
	ReasonParked     = "MoveParked"
	ReasonSalvaged   = "MoveSalvaged"
)

// WritesLost is the time of writes a salvage loses: from the seed to the
// stop of the workload, as the old PV's annotations record them; ok is
// false when they do not (an annotation removed or edited by hand).
func WritesLost(pvAnnotations map[string]string) (seed, stopped time.Time, ok bool) {
	seed, err1 := time.Parse(time.RFC3339Nano, pvAnnotations[AnnSeedTime])
	stopped, err2 := time.Parse(time.RFC3339Nano, pvAnnotations[AnnStopped])
	if err1 != nil || err2 != nil || stopped.Before(seed) {
		return time.Time{}, time.Time{}, false
	}
	return seed, stopped, true
}

// WritesLostText says, for people, which writes a salvage of the move
// of the old PV with these annotations loses (WritesLost).
func WritesLostText(pvAnnotations map[string]string) string {
	seed, stopped, ok := WritesLost(pvAnnotations)
	if !ok {
		return "the writes made after the seed are lost (when the seed was made is not recorded)"
	}
	return fmt.Sprintf("the writes from the seed (%s) until the workload stopped (%s), at most %s, are lost",
		seed.Format(time.RFC3339), stopped.Format(time.RFC3339), stopped.Sub(seed).Round(time.Second))
}

// Targets are the volumes a move in flight made or makes on behalf of the
// old PV with these annotations and that no PV names yet (its target, by
// CSI name and by ID): the audit must not take them for orphans.
func Targets(pvAnnotations map[string]string) (name, id string) {
	if pvAnnotations[AnnPhase] == "" {
		return "", ""
	}
	return pvAnnotations[AnnTarget], pvAnnotations[AnnTargetID]
}

// Reasons of the google.rpc.ErrorInfo (domain ErrorDomain) a node agent
// puts on a status the mover decides on: the code alone does not tell
// a copy still running from another holder of the volume, nor a
// refusal no retry mends from one the workload's stop mends.
const (
	ErrorDomain = "carve.dev"
	// ErrorCopyInProgress (ABORTED): the volume's data is being copied
	// into it by an earlier call of the same CreateVolume; a repeat once
	// the copy ends answers with the volume.
	ErrorCopyInProgress = "COPY_IN_PROGRESS"
	// ErrorSizeMismatch (FAILED_PRECONDITION): a catch-up's target is not
	// of its source's size.
	ErrorSizeMismatch = "SIZE_MISMATCH"
	// ErrorBaseOverflowed (FAILED_PRECONDITION): a catch-up's base, a
	// copy-on-write snapshot, ran out of its space: it no longer holds
	// what the target was copied from.
	ErrorBaseOverflowed = "BASE_OVERFLOWED"
	// ErrorSourceCopyPending (FAILED_PRECONDITION): a catch-up's source
	// is itself still being copied into.
	ErrorSourceCopyPending = "SOURCE_COPY_PENDING"
	// ErrorNotFromBase (FAILED_PRECONDITION): a catch-up's target was not
	// made from its base (its source tag names another snapshot, or
	// none): what it holds is not what the changes are counted from.
	ErrorNotFromBase = "TARGET_NOT_FROM_BASE"
)
