// Package router is the CSI Controller service of `carve controller`: each
// call goes over the node channel to the agent owning the volume or
// snapshot, found from the request, the PV index, or asking the agents. A
// call never sent is RESOURCE_EXHAUSTED for CreateVolume (csi-provisioner
// reschedules) and UNAVAILABLE otherwise; a sent call keeps the node's code,
// and a CreateVolume that may have started on a node is never moved
// (pending).
package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/controller/paging"
	"github.com/carve-csi/carve/internal/csiserver"
)

// ErrUnreachable: no verified connection to the agent; nothing was sent.
var ErrUnreachable = errors.New("node agent unreachable")

// Nodes are the node agents the controller is connected to.
type Nodes interface {
	// Controller returns the node agent's CSI Controller client, or an error
	// wrapping ErrUnreachable.
	Controller(ctx context.Context, node string) (csi.ControllerClient, error)
	// Names lists the connected nodes.
	Names() []string
}

// Locator finds a volume's nodes from its PVs; *pvindex.Index is one.
type Locator interface {
	// NodesOf returns the nodes handle's PVs pin ("" for none pinned); an error
	// (index not filled) means unknown.
	NodesOf(handle string) ([]string, error)
	// PVsOf returns the names of the PVs that hold handle.
	PVsOf(handle string) ([]string, error)
}

// Config holds what the router needs.
type Config struct {
	// Nodes reaches the node agents.
	Nodes Nodes
	// Volumes maps a volume handle to its node.
	Volumes Locator
	// TopologyKey is carve's node topology key.
	TopologyKey string
	// Agents grants cross-node copies; nil keeps copies on the source's node.
	Agents Agents
	// Moves, when set, holds back claims being moved.
	Moves Moves
	// Refusals counts refused node answers; nil counts none.
	Refusals *Refusals
	// Paging bounds each node's list pages; zero is paging.Default.
	Paging paging.Limits
	// Keys wraps new encrypted volumes' keys; nil refuses them.
	Keys VolumeKeys
	// Sent keeps each claim's sent CreateVolume node; nil keeps it in memory.
	Sent SentCreates
}

func (s *Server) limits() paging.Limits {
	if s.cfg.Paging == (paging.Limits{}) {
		return paging.Default()
	}
	return s.cfg.Paging
}

// Server implements csi.ControllerServer by routing; publish, controller
// expansion and GetCapacity are Unimplemented and not advertised.
type Server struct {
	csi.UnimplementedControllerServer
	cfg      Config
	pending  pending
	copyRuns copyRuns
}

var _ csi.ControllerServer = (*Server)(nil)

// New returns the router of cfg.
func New(cfg Config) *Server { return &Server{cfg: cfg} }

// ControllerGetCapabilities implements csi.ControllerServer.
func (s *Server) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return csiserver.ControllerCapabilities(csiserver.ControllerRPCs...), nil
}

type rpc[Req, Resp any] func(csi.ControllerClient, context.Context, Req, ...grpc.CallOption) (Resp, error)

func send[Req, Resp any](ctx context.Context, s *Server, node, method string, f rpc[Req, Resp], req Req, unsent codes.Code) (Resp, error) {
	c, ctx, err := s.agent(ctx, node, method, unsent)
	if err != nil {
		var zero Resp
		return zero, err
	}
	return call(ctx, c, node, f, req)
}

// agent is node's client and a context whose logger names node and method;
// unsent is the code for an unreachable agent.
func (s *Server) agent(ctx context.Context, node, method string, unsent codes.Code) (csi.ControllerClient, context.Context, error) {
	logger := klog.FromContext(ctx).WithValues("node", node, "call", method)
	c, err := s.cfg.Nodes.Controller(ctx, node)
	if err != nil {
		logger.V(2).Info("Not sent: no connection to the node agent", "err", err.Error())
		return nil, ctx, notSent(ctx, node, err, unsent)
	}
	logger.V(4).Info("Routing")
	return c, klog.NewContext(ctx, logger), nil
}

// call sends req; the answer, or the transport's failure once handed to the
// connection, keeps its code with the node named.
func call[Req, Resp any](ctx context.Context, c csi.ControllerClient, node string, f rpc[Req, Resp], req Req) (Resp, error) {
	resp, err := f(c, ctx, req)
	if err != nil {
		var zero Resp
		return zero, fromNode(node, err)
	}
	return resp, nil
}

// notSent is the status of a call that never left: code for an unreachable
// agent, the context's end, or UNAVAILABLE.
func notSent(ctx context.Context, node string, err error, code codes.Code) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if !errors.Is(err, ErrUnreachable) {
		code = codes.Unavailable
	}
	if code == codes.ResourceExhausted {
		return status.Errorf(code, "the agent of node %s is unreachable; nothing was created: %v", node, err)
	}
	return status.Errorf(code, "the agent of node %s is unreachable; nothing was sent: %v", node, err)
}

// fromNode names node in err, code and details unchanged.
func fromNode(node string, err error) error {
	st := status.Convert(err)
	p := st.Proto()
	p.Message = fmt.Sprintf("node %s: %s", node, p.GetMessage())
	return status.FromProto(p).Err()
}
