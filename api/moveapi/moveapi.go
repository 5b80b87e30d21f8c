// Package moveapi is a move of a claim to another node as it shows on Kubernetes
// objects: annotations, phases, Event reasons and ErrorInfo reasons. It imports only
// the standard library, so kubectl-carve does not link the mover.
package moveapi

import (
	"fmt"
	"time"
)

// Annotations: AnnMoveTo is the request on the claim; the others hold the move's
// state on the old PV.
const (
	AnnPrefix = "carve.dev/move-"
	// AnnMoveTo on a claim asks to move it to that node (AnyNode: the one with most room);
	// on the old PV it is the move's target node.
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
	// AnnSeedName is the seed's CSI name, new for each move, so a target an earlier move
	// left is never taken for a copy of this move's seed.
	AnnSeedName = AnnPrefix + "seed-name"
	// AnnSeedTime is when the seed snapshot was made (RFC 3339).
	AnnSeedTime = AnnPrefix + "seed-time"
	// AnnStopped is when no pod writes to the old volume any more (RFC 3339).
	AnnStopped = AnnPrefix + "stopped"
	// AnnSalvage on the old PV of a move parked while catching up binds the claim to the
	// target as of the seed; writes since the seed are lost (WritesLost).
	AnnSalvage = AnnPrefix + "salvage"
	// AnnClaim is the claim as it was before stopping (JSON).
	AnnClaim = AnnPrefix + "claim"
	// AnnPhaseSince is when the current phase started (RFC 3339).
	AnnPhaseSince = AnnPrefix + "phase-since"
	// AnnDurations are the past phases' durations ("seeding=1.5s,...").
	AnnDurations = AnnPrefix + "durations"
	// AnnBytes is what the catch-up sent.
	AnnBytes = AnnPrefix + "bytes"
	// AnnAbort on the old PV asks to roll the move back while still possible; on a parked
	// move it releases the claim's name and keeps the target and seed.
	AnnAbort = AnnPrefix + "abort"
	// AnnParked is why a move is parked: nothing of it is deleted.
	AnnParked = AnnPrefix + "parked"
	// AnnParkedFrom is the phase a parked move resumes at.
	AnnParkedFrom = AnnPrefix + "parked-from"
	// AnnWaiting is what the move waits for or the last failure it retries.
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
	// PhaseParked: the old volume is not known to be there and whole, so the target and
	// seed, maybe the only copy, are kept until its node answers or someone decides.
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

// WritesLost is the span of writes a salvage loses (seed to stop); ok is false when
// the annotations do not record it.
func WritesLost(pvAnnotations map[string]string) (seed, stopped time.Time, ok bool) {
	seed, err1 := time.Parse(time.RFC3339Nano, pvAnnotations[AnnSeedTime])
	stopped, err2 := time.Parse(time.RFC3339Nano, pvAnnotations[AnnStopped])
	if err1 != nil || err2 != nil || stopped.Before(seed) {
		return time.Time{}, time.Time{}, false
	}
	return seed, stopped, true
}

// WritesLostText says for people which writes a salvage loses.
func WritesLostText(pvAnnotations map[string]string) string {
	seed, stopped, ok := WritesLost(pvAnnotations)
	if !ok {
		return "the writes made after the seed are lost (when the seed was made is not recorded)"
	}
	return fmt.Sprintf("the writes from the seed (%s) until the workload stopped (%s), at most %s, are lost",
		seed.Format(time.RFC3339), stopped.Format(time.RFC3339), stopped.Sub(seed).Round(time.Second))
}

// Targets are the volumes a move made that no PV names yet: not orphans for the audit.
func Targets(pvAnnotations map[string]string) (name, id string) {
	if pvAnnotations[AnnPhase] == "" {
		return "", ""
	}
	return pvAnnotations[AnnTarget], pvAnnotations[AnnTargetID]
}

// ErrorInfo reasons (domain ErrorDomain) a node agent sets where the code alone does
// not tell the mover what to do.
const (
	ErrorDomain = "carve.dev"
	// ErrorCopyInProgress (ABORTED): an earlier call still copies into the volume.
	ErrorCopyInProgress = "COPY_IN_PROGRESS"
	// ErrorSizeMismatch (FAILED_PRECONDITION): a catch-up's target differs in size.
	ErrorSizeMismatch = "SIZE_MISMATCH"
	// ErrorBaseOverflowed (FAILED_PRECONDITION): a catch-up's COW base ran out of space.
	ErrorBaseOverflowed = "BASE_OVERFLOWED"
	// ErrorSourceCopyPending (FAILED_PRECONDITION): a catch-up's source is still a copy.
	ErrorSourceCopyPending = "SOURCE_COPY_PENDING"
	// ErrorNotFromBase (FAILED_PRECONDITION): a catch-up's target was not made from its base.
	ErrorNotFromBase = "TARGET_NOT_FROM_BASE"
)
