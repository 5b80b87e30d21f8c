package mover

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/carve-csi/carve/api/moveapi"
)

// PVLister lists carve's PVs with move annotations; *pvindex.Index is one.
type PVLister interface {
	List() []*corev1.PersistentVolume
}

// Claims tells the router which claims a move holds: from stopping until the
// move ends, no fresh volume may be provisioned for that name (a StatefulSet
// makes a deleted claim again).
type Claims struct{ PVs PVLister }

// held are the phases holding the claim's name. A parked move holds it too,
// until asked to abort.
var held = []string{moveapi.PhaseStopping, moveapi.PhaseCatchingUp, moveapi.PhaseBinding, moveapi.PhaseRollingBack, moveapi.PhaseParked}

// MoveOf describes the move that holds the claim namespace/name, if one does.
func (c Claims) MoveOf(namespace, name string) (string, bool) {
	for _, pv := range c.PVs.List() {
		phase := pv.Annotations[moveapi.AnnPhase]
		r := pv.Spec.ClaimRef
		if r == nil || r.Namespace != namespace || r.Name != name || !slices.Contains(held, phase) ||
			phase == moveapi.PhaseParked && pv.Annotations[moveapi.AnnAbort] != "" {
			continue
		}
		return fmt.Sprintf("claim %s/%s is being moved to node %s (PersistentVolume %s, phase %s): it is bound to the moved volume (%s) when the move binds it",
			namespace, name, pv.Annotations[moveapi.AnnMoveTo], pv.Name, phase, pv.Annotations[moveapi.AnnTarget]), true
	}
	return "", false
}
