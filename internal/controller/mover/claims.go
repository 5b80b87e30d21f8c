package mover

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/carve-csi/carve/api/moveapi"
)

// PVLister lists carve's PVs with the move's annotations;
// *pvindex.Index is one (its cache keeps moveapi.AnnPrefix annotations).
type PVLister interface {
	List() []*corev1.PersistentVolume
}

// Claims tells the router which claims a move holds: from stopping on
// (the claim deleted, or being deleted) until the move ends, nothing must
// provision a fresh volume for a claim of that namespace and name (a
// StatefulSet makes a deleted claim again from its template): the move
// binds it to the moved volume, or to the old one when it rolls back.
type Claims struct{ PVs PVLister }

// held are the phases in which a move holds its claim's name.
// A parked move holds it too (a fresh empty volume must not start in
// place of the kept copy without someone deciding so), until it is asked
// to abort: then the claim can be made anew, as for a node lost for good.
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
