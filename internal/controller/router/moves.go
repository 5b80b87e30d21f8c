package router

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/volume"
)

// Moves tells which claims a move to another node holds (internal/controller/mover:
// from the moment it deletes the claim until it binds it again);
// mover.Claims is one.
type Moves interface {
	// MoveOf describes the move that holds the claim namespace/name, if
	// one does.
	MoveOf(namespace, name string) (string, bool)
}

// refuseMoved refuses a CreateVolume for a claim a move holds: a
// StatefulSet makes the claim again from its template while the move
// runs, and provisioning it would give the workload a fresh empty volume
// instead of its moved data. RESOURCE_EXHAUSTED: nothing was made, and
// csi-provisioner tries again (for a WaitForFirstConsumer claim, after
// the scheduler chose again); by then the move has bound the claim to its
// pre-bound PV and csi-provisioner stops. The claim's name comes from
// csi-provisioner's --extra-create-metadata.
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
