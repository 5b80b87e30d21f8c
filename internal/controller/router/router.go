// Package router is the CSI Controller service of `carve controller`: it
// serves csi-provisioner, csi-snapshotter and csi-resizer on the
// controller's socket and sends each call to the node agent that owns the
// volume or snapshot, over the node channel. It keeps no record of
// volumes: the node of a call comes from the request (a CreateVolume's
// accessibility requirement, a snapshot ID), from the PersistentVolume
// index (volume handle -> node) or, for a handle no PV has, from asking
// the connected node agents. (It remembers only, in memory, the creates
// whose outcome on a node is in doubt: see pending.)
//
// It replaces csiserver.ResizerOnlyController in the controller role. The
// controller role keeps csiserver.NewIdentityServer (which must advertise
// VOLUME_ACCESSIBILITY_CONSTRAINTS, or csi-provisioner sends no
// accessibility requirements) and csiserver.ResizerOnlyNode (csi-resizer
// asks it for EXPAND_VOLUME: carve grows volumes on the node).
//
// Codes: a call that was never sent because the node's agent is not
// connected is RESOURCE_EXHAUSTED for CreateVolume (csi-provisioner then
// reschedules the claim: nothing was made anywhere) and UNAVAILABLE for
// every other call. A call that was sent returns the node's answer,
// transport failures included, with its code unchanged: a CreateVolume
// that may have started on a node is retried on that node, never moved,
// and so is a later attempt of it that cannot reach the node (pending).
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

// ErrUnreachable: no verified connection to the node's agent exists;
// nothing was sent.
var ErrUnreachable = errors.New("node agent unreachable")

// Nodes are the node agents the controller is connected to.
type Nodes interface {
	// Controller returns the CSI Controller client of the node's agent, or
	// an error wrapping ErrUnreachable (also for a node it does not know).
	Controller(ctx context.Context, node string) (csi.ControllerClient, error)
	// Names lists the nodes whose agent is connected now.
	Names() []string
}

// Locator finds the nodes of a volume handle from its PersistentVolumes;
// *pvindex.Index satisfies it.
type Locator interface {
	// NodesOf returns the nodes the PVs of handle are pinned to: none when
	// no PV has it, "" for a PV pinned to no node. An error (the index not
	// filled yet) means the answer is not known.
	NodesOf(handle string) ([]string, error)
	// PVsOf returns the names of the PVs that hold handle, with the same
	// error.
	PVsOf(handle string) ([]string, error)
}

// Config holds what the router needs; main builds it.
type Config struct {
	// Nodes reaches the node agents.
	Nodes Nodes
	// Volumes maps a volume handle to its node.
	Volumes Locator
	// TopologyKey is the key whose value is the node name in topology
	// segments (topology.Key).
	TopologyKey string
	// Agents grants copies across nodes; nil makes a restore or clone
	// on its source's node only.
	Agents Agents
	// Moves, when set, holds back the claims being moved (moves.go).
	Moves Moves
	// Refusals counts the node answers refused (answers.go); nil counts
	// none (they are still refused and logged).
	Refusals *Refusals
	// Paging bounds each node's list pages; zero is paging.Default.
	Paging paging.Limits
	// Keys wraps the keys of new encrypted volumes (encrypt.go); nil
	// makes none (such a CreateVolume is FAILED_PRECONDITION).
	Keys VolumeKeys
	// Sent keeps, on each claim, the node its CreateVolume was sent to
	// (sent.go); nil keeps it in this replica's memory only.
	Sent SentCreates
}

// limits are the paging limits of one node's list.
func (s *Server) limits() paging.Limits {
	if s.cfg.Paging == (paging.Limits{}) {
		return paging.Default()
	}
	return s.cfg.Paging
}

// Server implements csi.ControllerServer by routing. Calls carve does not
// serve (publish, controller expansion, GetCapacity) are Unimplemented
// and not advertised.
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

// rpc is a ControllerClient method, as a method expression
// (csi.ControllerClient.DeleteVolume).
type rpc[Req, Resp any] func(csi.ControllerClient, context.Context, Req, ...grpc.CallOption) (Resp, error)

// send calls method on node's agent: see agent and call.
func send[Req, Resp any](ctx context.Context, s *Server, node, method string, f rpc[Req, Resp], req Req, unsent codes.Code) (Resp, error) {
	c, ctx, err := s.agent(ctx, node, method, unsent)
	if err != nil {
		var zero Resp
		return zero, err
	}
	return call(ctx, c, node, f, req)
}

// agent is the client of node's agent and a context whose logger names
// the node and method. Not reaching the agent is the status notSent
// gives, with unsent for an unreachable agent.
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

// call sends req: the agent's answer, or the transport's failure once the
// call was handed to the connection, comes back with its code unchanged
// and the node's name in front of its message.
func call[Req, Resp any](ctx context.Context, c csi.ControllerClient, node string, f rpc[Req, Resp], req Req) (Resp, error) {
	resp, err := f(c, ctx, req)
	if err != nil {
		var zero Resp
		return zero, fromNode(node, err)
	}
	return resp, nil
}

// notSent is the status of a call that never left: code for an
// unreachable agent (RESOURCE_EXHAUSTED for CreateVolume, UNAVAILABLE
// otherwise), the context's own end, or UNAVAILABLE for anything else.
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

// fromNode is a node's error with the node named: its code (and details)
// unchanged.
func fromNode(node string, err error) error {
	st := status.Convert(err)
	p := st.Proto()
	p.Message = fmt.Sprintf("node %s: %s", node, p.GetMessage())
	return status.FromProto(p).Err()
}
