package router

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/reason"
	"github.com/carve-csi/carve/internal/copyticket"
	"github.com/carve-csi/carve/internal/volume"
)

// ParamCrossNodeCopy is the StorageClass parameter that allows ("true", the
// default) or forbids restores and clones on another node than their
// source's. The router removes it: node agents do not know it.
const ParamCrossNodeCopy = "carve.dev/cross-node-copy"

// copyGrantValidity is how long a source node waits for the grant's read;
// the target starts it at once.
const copyGrantValidity = 120

// Agents reach the node agents for copies across nodes; *agents.Pool is one.
type Agents interface {
	// NodeAgent is node's NodeAgent client (ErrUnreachable when not connected).
	NodeAgent(ctx context.Context, node string) (nodeagentv1.NodeAgentClient, error)
	// Host is the address (no port) node's agent is reached at.
	Host(node string) (string, error)
}

// crossNodeCopy reads and removes ParamCrossNodeCopy from req (returning a
// copy when present): allowed unless "false".
func crossNodeCopy(req *csi.CreateVolumeRequest) (*csi.CreateVolumeRequest, bool, error) {
	v, ok := req.GetParameters()[ParamCrossNodeCopy]
	if !ok {
		return req, true, nil
	}
	allowed, err := strconv.ParseBool(v)
	if err != nil {
		return nil, false, status.Errorf(codes.InvalidArgument, "parameters: %s %q: must be true or false", ParamCrossNodeCopy, v)
	}
	req = proto.Clone(req).(*csi.CreateVolumeRequest)
	delete(req.Parameters, ParamCrossNodeCopy)
	return req, allowed, nil
}

// sourceNode is the single known node of req's content source.
func (s *Server) sourceNode(req *csi.CreateVolumeRequest) (node, id string, snapshot bool) {
	switch cs := req.GetVolumeContentSource(); {
	case cs.GetSnapshot() != nil:
		id = cs.GetSnapshot().GetSnapshotId()
		n, _, _, err := volume.ParseSnapshotID(id)
		if err != nil {
			return "", id, true
		}
		return n, id, true
	case cs.GetVolume() != nil:
		id = cs.GetVolume().GetVolumeId()
		if !isVolumeID(id) {
			return "", id, false
		}
		nodes, err := s.cfg.Volumes.NodesOf(id)
		if err != nil {
			return "", id, false
		}
		nodes = slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == "" })
		if len(nodes) != 1 {
			return "", id, false
		}
		return nodes[0], id, false
	}
	return "", "", false
}

// grantCopy asks the source's node to grant node one read of req's source,
// and returns ctx carrying the grant (copyticket.Metadata). An unreachable or
// non-copying source node is RESOURCE_EXHAUSTED, so the scheduler may pick
// the source's node. A source the node lacks is no error: the target
// answers (a retry still finds a volume made already).
func (s *Server) grantCopy(ctx context.Context, req *csi.CreateVolumeRequest, node, from, id string, snapshot bool, unsent codes.Code) (context.Context, error) {
	log := klog.FromContext(ctx).WithValues("sourceNode", from, "source", id, "node", node)
	refuse := func(why string) error {
		return status.Errorf(unsent, "volume_content_source: %s lives on node %s, not on %s, and %s; nothing was created "+
			"(the pod is scheduled again; pin it to %s to restore or clone there: see docs/backup-restore.md)", id, from, node, why, from)
	}
	c, err := s.cfg.Agents.NodeAgent(ctx, from)
	if err != nil {
		return ctx, refuse(fmt.Sprintf("that node's agent cannot be reached to copy it: %v", err))
	}
	host, err := s.cfg.Agents.Host(from)
	if err != nil {
		return ctx, refuse(fmt.Sprintf("that node's agent cannot be reached to copy it: %v", err))
	}
	copyID, err := newCopyID()
	if err != nil {
		return ctx, status.Errorf(codes.Internal, "a copy ID: %v", err)
	}
	areq := &nodeagentv1.AuthorizeCopyRequest{CopyId: copyID, TargetNode: node, TargetVolumeName: req.GetName(), ValidSeconds: copyGrantValidity}
	if snapshot {
		areq.SnapshotId = id
	} else {
		areq.VolumeId = id
	}
	resp, err := c.AuthorizeCopy(ctx, areq)
	switch status.Code(err) {
	case codes.OK:
	case codes.NotFound:
		log.V(2).Info("The source's node does not have it; the target answers", "err", err)
		return ctx, nil
	case codes.Unimplemented:
		return ctx, refuse("that node copies its volumes to no other node (its agent runs without --node-copy-address)")
	default:
		return ctx, fromNode(from, err)
	}
	rs := copyticket.Ticket{CopyID: copyID, ID: id, Snapshot: snapshot, Node: from,
		Address: net.JoinHostPort(host, strconv.Itoa(int(resp.GetCopyPort()))), Size: uint64(resp.GetSizeBytes())}
	log.V(2).Info("Granted a copy across nodes", "copy", copyID, "size", rs.Size, "address", rs.Address)
	return metadata.AppendToOutgoingContext(ctx, copyticket.Metadata(rs)...), nil
}

func newCopyID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// copyRuns remembers, by node and name, cross-node copies that may still run
// on their target after their call ended (a deadline, a connection replaced
// on certificate renewal); repeats answer ABORTED until the copy ends. Such
// a repeat is sent without a new grant, which would lapse unread; only an
// answer saying no copy runs is followed by a new grant. It is this
// replica's memory and only saves grants.
type copyRuns struct {
	mu    sync.Mutex
	names map[copyRun]bool
}

type copyRun struct{ node, name string }

// maxCopyRuns bounds the memory; beyond it, repeats are granted anew.
const maxCopyRuns = 10000

func (r *copyRuns) mayRun(node, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.names[copyRun{node, name}]
}

// answered records node's answer to a CreateVolume of name.
func (r *copyRuns) answered(node, name string, err error) {
	if !copyMayRun(err) {
		r.forget(node, name)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names == nil {
		r.names = map[copyRun]bool{}
	}
	if len(r.names) < maxCopyRuns {
		r.names[copyRun{node, name}] = true
	}
}

func (r *copyRuns) forget(node, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.names, copyRun{node, name})
}

// copyMayRun tells whether the copy may still run after this answer: the
// target says so, or the answer does not say how the call ended.
func copyMayRun(err error) bool {
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable:
		return true
	}
	return reason.CopyInProgress(err)
}
