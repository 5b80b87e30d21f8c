package router

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/volume"
)

// CreateVolume implements csi.ControllerServer, sending the call to the node
// the accessibility requirement names; without one, a restore goes to its
// snapshot's node, a clone to its source's, and a plain volume is refused.
// A clone on another node than its source PV's is refused here
// (cloneElsewhere): the node agent has no API access to tell. A restore or
// clone elsewhere is a cross-node copy (grantCopy) unless the class forbids
// it. An unreachable node is RESOURCE_EXHAUSTED, so csi-provisioner asks the
// scheduler again, unless an earlier attempt may have started there
// (pending).
func (s *Server) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name: must be set")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities: at least one capability must be given")
	}
	if err := s.refuseMoved(req); err != nil {
		return nil, err
	}
	req, copies, err := crossNodeCopy(req)
	if err != nil {
		return nil, err
	}
	req, kc, err := s.withVolumeKey(ctx, req)
	if err != nil {
		return nil, err
	}
	node, err := s.nodeOfCreate(ctx, req)
	if err != nil {
		return nil, err
	}
	unsent := codes.ResourceExhausted
	from, id, snapshot := s.sourceNode(req)
	if !copies || s.cfg.Agents == nil || from == "" || from == node {
		if err := s.cloneElsewhere(node, req.GetVolumeContentSource().GetVolume().GetVolumeId()); err != nil {
			return nil, err
		}
		return s.sendCreate(ctx, req, node, unsent, kc)
	}
	// A copy that may still run on node is asked about without a new grant.
	if s.copyRuns.mayRun(node, req.GetName()) {
		resp, err := s.sendCreate(ctx, req, node, unsent, kc)
		if err == nil || copyMayRun(err) || ctx.Err() != nil {
			s.copyRuns.answered(node, req.GetName(), err)
			return resp, err
		}
		klog.FromContext(ctx).V(2).Info("No copy runs on the node any more; granting a new one", "node", node, "answer", err)
		s.copyRuns.forget(node, req.GetName())
	}
	if ctx, err = s.grantCopy(ctx, req, node, from, id, snapshot, unsent); err != nil {
		return nil, s.notSentCreate(ctx, req, node, err)
	}
	resp, err := s.sendCreate(ctx, req, node, unsent, kc)
	s.copyRuns.answered(node, req.GetName(), err)
	return resp, err
}

// sendCreate records the send on the claim, sends, and checks the answer.
func (s *Server) sendCreate(ctx context.Context, req *csi.CreateVolumeRequest, node string, unsent codes.Code, kc keyCheck) (*csi.CreateVolumeResponse, error) {
	c, ctx, err := s.agent(ctx, node, "CreateVolume", unsent)
	if err != nil {
		return nil, s.notSentCreate(ctx, req, node, err)
	}
	if err := s.sending(ctx, req, node); err != nil {
		return nil, err
	}
	resp, err := call(ctx, c, node, csi.ControllerClient.CreateVolume, req)
	if err != nil {
		s.answered(ctx, req, node, status.Code(err))
		return nil, err
	}
	if err := s.checkCreated(ctx, node, req.GetName(), resp); err != nil {
		return nil, err
	}
	if err := s.checkKey(ctx, node, kc, resp); err != nil {
		return nil, err
	}
	s.answered(ctx, req, node, codes.OK)
	return resp, nil
}

// cloneElsewhere refuses a clone of id on node when PVs pin id elsewhere:
// RESOURCE_EXHAUSTED naming them, so the scheduler picks again. UNAVAILABLE
// while the PV index is not filled; a source no PV names is the node's to
// find.
func (s *Server) cloneElsewhere(node, id string) error {
	// An ID that is not carve's is no PV's: the node answers NotFound.
	if !isVolumeID(id) {
		return nil
	}
	nodes, err := s.cfg.Volumes.NodesOf(id)
	if err != nil {
		return status.Errorf(codes.Unavailable, "volume_content_source: volume %s: its node is not known yet: %v; retry later", id, err)
	}
	nodes = slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == "" })
	if len(nodes) == 0 || slices.Contains(nodes, node) {
		return nil
	}
	return status.Errorf(codes.ResourceExhausted, "volume_content_source: volume %s lives on node %s, not on %s: a clone is made on its source's node only; "+
		"the pod is scheduled again (pin it to %s: see docs/backup-restore.md)", id, strings.Join(nodes, ", "), node, nodes[0])
}

func (s *Server) nodeOfCreate(ctx context.Context, req *csi.CreateVolumeRequest) (string, error) {
	node, err := s.requiredNode(req.GetAccessibilityRequirements())
	if err != nil || node != "" {
		return node, err
	}
	switch cs := req.GetVolumeContentSource(); {
	case cs.GetSnapshot() != nil:
		id := cs.GetSnapshot().GetSnapshotId()
		if id == "" {
			return "", status.Error(codes.InvalidArgument, "volume_content_source.snapshot.snapshot_id: must be set")
		}
		node, _, _, err := volume.ParseSnapshotID(id)
		if err != nil {
			// Not a snapshot carve made: NotFound, as the CSI spec asks of a source.
			return "", status.Errorf(codes.NotFound, "volume_content_source.snapshot.snapshot_id: snapshot %q does not exist: %v", id, err)
		}
		return node, nil
	case cs.GetVolume() != nil:
		id := cs.GetVolume().GetVolumeId()
		if id == "" {
			return "", status.Error(codes.InvalidArgument, "volume_content_source.volume.volume_id: must be set")
		}
		node, err := s.nodeOfVolume(ctx, id)
		if errors.Is(err, errNoVolume) {
			return "", status.Errorf(codes.NotFound, "volume_content_source.volume.volume_id: volume %q does not exist", id)
		}
		return node, err
	}
	return "", status.Errorf(codes.InvalidArgument, "accessibility_requirements: no requisite or preferred segment names a node under %s; "+
		"carve makes a volume on the node the scheduler selected (csi-provisioner with --strict-topology, a StorageClass with volumeBindingMode WaitForFirstConsumer)",
		s.cfg.TopologyKey)
}

// requiredNode is the node a requirement names: preferred[0]'s, else the
// requisite's ("" with no segment). csi-provisioner --strict-topology puts
// the selected node alone in both; a requisite of several nodes (Immediate
// binding) is refused, as carve cannot pick a node with room.
func (s *Server) requiredNode(req *csi.TopologyRequirement) (string, error) {
	key := s.cfg.TopologyKey
	var requisite []string
	for _, t := range req.GetRequisite() {
		if n := t.GetSegments()[key]; n != "" && !slices.Contains(requisite, n) {
			requisite = append(requisite, n)
		}
	}
	if len(requisite) > 1 {
		return "", status.Errorf(codes.InvalidArgument, "accessibility_requirements.requisite: names %d nodes (%s); carve makes a volume only on the node the scheduler selected: "+
			"use a StorageClass with volumeBindingMode WaitForFirstConsumer", len(requisite), strings.Join(requisite, ", "))
	}
	var preferred string
	if p := req.GetPreferred(); len(p) > 0 {
		preferred = p[0].GetSegments()[key]
	}
	switch {
	case preferred != "" && len(requisite) == 1 && preferred != requisite[0]:
		// The CSI spec: every preferred segment is in the requisite.
		return "", status.Errorf(codes.InvalidArgument, "accessibility_requirements.preferred[0]: node %s is not the requisite's node %s", preferred, requisite[0])
	case preferred != "":
		return preferred, nil
	case len(requisite) == 1:
		return requisite[0], nil
	case len(req.GetRequisite())+len(req.GetPreferred()) > 0:
		return "", status.Errorf(codes.InvalidArgument, "accessibility_requirements: no segment carries the topology key %s", key)
	}
	return "", nil
}

func isVolumeID(id string) bool {
	_, err := volume.ParseID(id)
	return err == nil
}

// claimOf is the claim from csi-provisioner's --extra-create-metadata.
func claimOf(req *csi.CreateVolumeRequest) (namespace, name string) {
	return req.GetParameters()[volume.ParamPVCNamespace], req.GetParameters()[volume.ParamPVCName]
}

// notSentCreate answers a CreateVolume that never reached node:
// RESOURCE_EXHAUSTED moves the claim, unless an earlier attempt may have
// started there; then UNAVAILABLE keeps it.
func (s *Server) notSentCreate(ctx context.Context, req *csi.CreateVolumeRequest, node string, err error) error {
	if status.Code(err) != codes.ResourceExhausted {
		return err
	}
	msg := status.Convert(err).Message()
	earlier, serr := s.sentEarlier(ctx, req, node)
	switch {
	case serr != nil:
		return status.Errorf(codes.Unavailable, "%s; whether an earlier attempt was sent to node %s is not known (%v), so the claim stays for now", msg, node, serr)
	case earlier:
		return status.Errorf(codes.Unavailable, "%s; an earlier attempt was sent to node %s and may have started there, so the volume stays on that node", msg, node)
	}
	return err
}

// sentEarlier tells whether a CreateVolume was sent to node and not answered
// for sure: per the claim's AnnCreateSentTo (seen by every replica), or this
// replica's memory for requests naming no claim.
func (s *Server) sentEarlier(ctx context.Context, req *csi.CreateVolumeRequest, node string) (bool, error) {
	ns, claim := claimOf(req)
	if s.cfg.Sent == nil || claim == "" {
		return s.pending.maybeStarted(req.GetName(), node), nil
	}
	sent, err := s.cfg.Sent.SentTo(ctx, ns, claim)
	return sent == node, err
}

// sending records the send before it leaves (on the claim, or in memory
// without a claim). A claim that cannot be annotated is UNAVAILABLE.
func (s *Server) sending(ctx context.Context, req *csi.CreateVolumeRequest, node string) error {
	ns, claim := claimOf(req)
	if s.cfg.Sent == nil || claim == "" {
		s.pending.sending(req.GetName(), node)
		return nil
	}
	if err := s.cfg.Sent.Sending(ctx, ns, claim, node); err != nil {
		return status.Errorf(codes.Unavailable, "recording on claim %s/%s that its volume is being made on node %s: %v; nothing was sent", ns, claim, node, err)
	}
	return nil
}

// answered records node's answer; one saying nothing was made takes the
// claim's record off. A volume made keeps it: csi-provisioner may end before
// writing the PV, and its next attempt must still go to that node.
func (s *Server) answered(ctx context.Context, req *csi.CreateVolumeRequest, node string, code codes.Code) {
	ns, claim := claimOf(req)
	if s.cfg.Sent == nil || claim == "" {
		s.pending.answered(req.GetName(), node, code)
		return
	}
	if !definite(code) || code == codes.OK {
		return
	}
	// The call's deadline may have passed: this is the controller's bookkeeping.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bookkeepingTimeout)
	defer cancel()
	if err := s.cfg.Sent.NotMade(ctx, ns, claim); err != nil {
		klog.FromContext(ctx).Error(err, "Taking the record of a create off its claim; the claim stays on the node while the node cannot be reached", "node", node)
	}
}

const bookkeepingTimeout = 10 * time.Second
