package peercopy

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/nodeca"
)

// Grant validity bounds; a grant only waits for its read to start, which
// may last longer.
const (
	DefaultValidity = 2 * time.Minute
	MaxValidity     = 10 * time.Minute
)

// Reader reads this node's sources; *provision.Provisioner is one.
type Reader interface {
	SourceSize(ctx context.Context, id string, snapshot bool) (uint64, error)
	ReadSource(ctx context.Context, id string, snapshot bool, target string, read func(device string, size uint64) error) error
}

var _ Reader = (*provision.Provisioner)(nil)

// ServerConfig configures a Server.
type ServerConfig struct {
	NodeName string
	Reader   Reader
	// Deltas reads volumes against snapshots for catch-ups; nil grants none.
	Deltas DeltaReader
	// Port is NodeCopy's port, told to the controller.
	Port int
	Now  func() time.Time
}

// Server is the source's side: it grants copies and serves NodeCopy.
type Server struct {
	nodeagentv1.UnimplementedNodeCopyServer
	cfg    ServerConfig
	grants *Grants
}

// NewServer returns the Server of cfg.
func NewServer(cfg ServerConfig) *Server {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Server{cfg: cfg, grants: NewGrants(cfg.Now)}
}

// RegisterMetrics registers carve_copy_grants_expired_total with reg.
func (s *Server) RegisterMetrics(reg prometheus.Registerer) error {
	return reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "carve_copy_grants_expired_total",
		Help: "Copy grants of this node (a restore, clone or catch-up on another node reading one of this node's sources) that lapsed unread: the copy failed before its read, or the controller gave it up.",
	}, func() float64 { return float64(s.grants.Expired()) }))
}

// Authorize answers AuthorizeCopy: the source must be here and readable.
func (s *Server) Authorize(ctx context.Context, req *nodeagentv1.AuthorizeCopyRequest) (*nodeagentv1.AuthorizeCopyResponse, error) {
	g := Grant{ID: req.GetCopyId(), TargetNode: req.GetTargetNode(), TargetName: req.GetTargetVolumeName()}
	switch {
	case g.ID == "":
		return nil, status.Error(codes.InvalidArgument, "copy_id: must be set")
	case (req.GetSnapshotId() == "") == (req.GetVolumeId() == ""):
		return nil, status.Error(codes.InvalidArgument, "snapshot_id, volume_id: exactly one must be set")
	case g.TargetName == "":
		return nil, status.Error(codes.InvalidArgument, "target_volume_name: must be set")
	case req.GetBaseSnapshotId() != "" && req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "base_snapshot_id: only with volume_id (a catch-up of a volume)")
	case g.TargetNode == s.cfg.NodeName:
		return nil, status.Errorf(codes.InvalidArgument, "target_node: %s is this node; a copy on the source's node needs no grant", g.TargetNode)
	}
	if err := nodeca.ValidateNodeName(g.TargetNode); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "target_node: %v", err)
	}
	if s.cfg.Port == 0 {
		return nil, status.Errorf(codes.Unimplemented, "node %s serves no copies to other nodes (--node-copy-address is empty)", s.cfg.NodeName)
	}
	g.Source, g.Snapshot, g.Base = req.GetVolumeId(), false, req.GetBaseSnapshotId()
	if req.GetSnapshotId() != "" {
		g.Source, g.Snapshot = req.GetSnapshotId(), true
	}
	valid := time.Duration(req.GetValidSeconds()) * time.Second
	if valid <= 0 {
		valid = DefaultValidity
	}
	g.Expires = s.cfg.Now().Add(min(valid, MaxValidity))
	size, err := s.sourceSize(ctx, g)
	if err != nil {
		return nil, nodestatus.OfRead(err, "the source of copy "+g.ID)
	}
	if err := s.grants.Add(g); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "copy %s: %v", g.ID, err)
	}
	klog.FromContext(ctx).V(2).Info("Granted a copy to another node", "copy", g.ID, "source", g.Source, "targetNode", g.TargetNode, "expires", g.Expires)
	return &nodeagentv1.AuthorizeCopyResponse{SizeBytes: int64(size), CopyPort: int32(s.cfg.Port)}, nil
}

// ReadVolume implements nodeagentv1.NodeCopyServer.
func (s *Server) ReadVolume(req *nodeagentv1.ReadVolumeRequest, stream nodeagentv1.NodeCopy_ReadVolumeServer) error {
	ctx := stream.Context()
	node, err := callerNode(ctx)
	if err != nil {
		return status.Errorf(codes.PermissionDenied, "copy %q: %v", req.GetCopyId(), err)
	}
	g, err := s.grants.Take(req.GetCopyId(), node)
	if err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	if g.Base != "" {
		return s.readDelta(ctx, g, node, req.GetAcceptsSentDigest(), stream)
	}
	log := klog.FromContext(ctx).WithValues("copy", g.ID, "source", g.Source, "targetNode", node)
	var sent Sent
	err = s.cfg.Reader.ReadSource(ctx, g.Source, g.Snapshot, g.TargetName, func(dev string, size uint64) error {
		var err error
		sent, err = Send(ctx, dev, size, stream)
		return err
	})
	if err != nil {
		log.Error(err, "A copy to another node failed", "sentBytes", sent.Data)
		return nodestatus.OfRead(err, "copy "+g.ID)
	}
	log.Info("Sent a copy to another node", "dataBytes", sent.Data, "duration", sent.Duration)
	return nil
}

func callerNode(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", errors.New("no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", errors.New("the caller did not come over TLS")
	}
	return nodeca.PeerNode(info.State)
}
