package router

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/volume"
)

// Moves tells which claims a move holds (from deleting the claim until
// binding it again); mover.Claims is one.
type Moves interface {
	// MoveOf describes the move holding the claim, if one does.
	MoveOf(namespace, name string) (string, bool)
}

// refuseMoved refuses a CreateVolume for a claim a move holds: a StatefulSet
// makes the claim again during the move, and provisioning it would give the
// workload an empty volume instead of its data. RESOURCE_EXHAUSTED: nothing
// made; by the retry the move has bound the claim to its pre-bound PV.
func (s *Server) refuseMoved(req *csi.CreateVolumeRequest) error {
	if s.cfg.Moves == nil {
		return nil
	}
	ns, name := req.GetParameters()[volume.ParamPVCNamespace], req.GetParameters()[volume.ParamPVCName]
	if ns == "" || name == "" {
		return nil
	}
	if why, ok := s.cfg.Moves.MoveOf(ns, name); ok {
		return status.Errorf(codes.ResourceExhausted, "not provisioning a new volume: %s; nothing was created", why)
	}
	return nil
}
