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

// ParamCrossNodeCopy is the StorageClass parameter that allows ("true",
// the default) or forbids ("false") restores and clones on another node
// than their source's. The router reads it and takes it out of the
// request: node agents do not know it.
const ParamCrossNodeCopy = "carve.dev/cross-node-copy"

// copyGrantValidity is how long a source node waits for the target's read
// of a grant: the target starts it within its CreateVolume, at once.
const copyGrantValidity = 120

// Agents reach the node agents' own service and address, for copies
// across nodes; *agents.Pool is one.
type Agents interface {
	// NodeAgent is the NodeAgent client of node's agent (an error wraps
	// ErrUnreachable when there is no connection).
	NodeAgent(ctx context.Context, node string) (nodeagentv1.NodeAgentClient, error)
	// Host is the address (no port) node's agent is reached at.
	Host(node string) (string, error)
}

// crossNodeCopy reads and removes ParamCrossNodeCopy from req (a copy of
// it is returned when the key was there): allowed unless "false".
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

// sourceNode is the node of req's content source when it is known and
// only one: a snapshot ID names it, a volume's PersistentVolume does.
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

// grantCopy asks the source's node to grant node one read of the source
// of req, and returns ctx carrying the grant for node's CreateVolume
// (copyticket.Metadata). A source node that serves no copies, or cannot be
// reached, is RESOURCE_EXHAUSTED (unsent) naming it: the claim goes back
// to the scheduler, which may pick the source's node. A source it does
// not have is no grant and no error: the target answers (a retry of a
// volume made already still finds it).
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

// newCopyID is a random copy ID.
func newCopyID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// copyRuns remembers, by node and CSI volume name, the copies across
// nodes that may still run on their target after the call that started
// them ended: the target copies detached from the call, so a call cut
// short (its deadline, a connection replaced on a certificate renewal)
// leaves the copy running, and the repeats of the CreateVolume answer
// ABORTED (reason.CopyInProgress) until it ends. Such a repeat needs no
// new grant from the source's node: the target would leave it unread,
// and it would lapse, counted as a grant left behind. So a repeat of a
// name remembered here is first sent without one; only an answer that
// says no copy runs any more (any other failure) is followed, in the
// same call, by a new grant and the CreateVolume with it.
//
// It is this replica's memory, and only saves grants: a repeat it does
// not know of (another replica, a restart) is granted as any first call.
type copyRuns struct {
	mu    sync.Mutex
	names map[copyRun]bool
}

type copyRun struct{ node, name string }

// maxCopyRuns bounds the copies remembered; beyond it, repeats are
// granted anew.
const maxCopyRuns = 10000

// mayRun tells whether a copy into name may still run on node.
func (r *copyRuns) mayRun(node, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.names[copyRun{node, name}]
}

// answered records node's answer to a CreateVolume of name: a copy may
// still run after an answer that does not say how it ended.
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

// forget drops name on node.
func (r *copyRuns) forget(node, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.names, copyRun{node, name})
}

// copyMayRun tells an answer to a CreateVolume after which the copy it
// asked for may still run on the target: the target says so, or the
// answer does not say how the call ended.
func copyMayRun(err error) bool {
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable:
		return true
	}
	return reason.CopyInProgress(err)
}
