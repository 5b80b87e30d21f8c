package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/node/channel"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/peercopy"
	"github.com/carve-csi/carve/internal/node/snapmeta"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/nodeca"
)

// Node channel keepalive: the agent pings an idle controller so a stream to
// a vanished one ends, and allows pings every nodeChannelMinPing (the
// controller pings every 10s; half leaves room for jitter).
const (
	nodeChannelPing    = 30 * time.Second
	nodeChannelMinPing = 5 * time.Second
)

// Bounds on what any pod reaching a node's ports holds open before proving
// anything: the handshake time, and the copy port's connections and streams
// (a copy is one stream).
const (
	handshakeTimeout   = 10 * time.Second
	maxCopyConnections = 64
	maxCopyStreams     = 4
)

type copyLimits struct {
	handshake   time.Duration
	connections int
	streams     uint32
}

func copyPortLimits() copyLimits {
	return copyLimits{handshake: handshakeTimeout, connections: maxCopyConnections, streams: maxCopyStreams}
}

// nodeChannel builds the node channel's TLS gRPC server (Identity,
// Controller, NodeAgent) on --node-channel-address. puller gets the agent's
// certificate for cross-node reads; with --node-copy-address, orphans serves
// this node's sources to granted nodes.
func nodeChannel(o *NodeOptions, cfg *deviceclass.Config, view *vgview.View, orphans channel.Orphans, svc csiserver.Services,
	mm csimetrics.CSIMetricsManager, puller *peercopy.Puller, keys *channel.Keys) (func(context.Context) error, error) {
	bundle := nodeca.NewBundleFile(o.NodeChannel.CAFile)
	acfg := channel.Config{NodeName: o.NodeName, TokenFile: o.NodeChannel.TokenFile,
		Trust: bundle.Pool(), Classes: cfg, Capacity: view, Inventory: view, Orphans: orphans, Keys: keys}
	var copies *peercopy.Server
	if o.NodeChannel.CopyAddress != "" {
		port, err := copyPort(o.NodeChannel.CopyAddress)
		if err != nil {
			return nil, err
		}
		reader, ok := orphans.(peercopy.Reader)
		if !ok {
			return nil, errors.New("--node-copy-address: the node channel has no source reader")
		}
		deltas, _ := orphans.(peercopy.DeltaReader)
		copies = peercopy.NewServer(peercopy.ServerConfig{NodeName: o.NodeName, Reader: reader, Deltas: deltas, Port: port})
		if err := copies.RegisterMetrics(mm.GetRegistry().Registerer()); err != nil {
			return nil, fmt.Errorf("--node-copy-address: %w", err)
		}
		acfg.Copies = copies
	}
	if target, ok := orphans.(peercopy.CatchUpTarget); ok && puller != nil {
		acfg.CatchUps = peercopy.CatchUps{Target: target}
	}
	if src, ok := orphans.(snapmeta.Source); ok {
		acfg.Blocks = &snapmeta.Server{Source: src}
	}
	agent, err := channel.New(acfg)
	if err != nil {
		return nil, fmt.Errorf("the node channel: %w", err)
	}
	if puller != nil {
		puller.Cert, puller.CAs = agent.Identity(), bundle.Pool()
	}
	serveCopies, err := copyListener(o, agent, copies)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := agent.ServerTLS()
	if err != nil {
		return nil, fmt.Errorf("the node channel: %w", err)
	}
	srv := csiserver.NewGRPCServer(csiserver.Services{Identity: svc.Identity, Controller: svc.Controller}, mm,
		csiserver.WithGRPCOptions(grpc.Creds(credentials.NewTLS(tlsCfg)), grpc.ConnectionTimeout(handshakeTimeout),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: nodeChannelPing, Timeout: nodeChannelMinPing}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: nodeChannelMinPing, PermitWithoutStream: true}),
			grpc.ChainUnaryInterceptor(peercopy.TicketInterceptor)),
		csiserver.WithServices(func(r grpc.ServiceRegistrar) { nodeagentv1.RegisterNodeAgentServer(r, agent) }),
		csiserver.WithUnloggedPayloads(channel.UnloggedMethods()...))
	return func(ctx context.Context) error {
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", o.NodeChannel.Address)
		if err != nil {
			return fmt.Errorf("--node-channel-address %s: %w", o.NodeChannel.Address, err)
		}
		go bundle.Run(ctx, nodeca.DefaultBundleCheck)
		go func() {
			<-ctx.Done()
			agent.Shutdown()
		}()
		klog.InfoS("Serving the node channel", "address", l.Addr().String(), "caFile", o.NodeChannel.CAFile)
		if serveCopies == nil {
			return serveGRPC(ctx, srv, l)
		}
		done := make(chan error, 1)
		go func() { done <- serveCopies(ctx) }()
		err = serveGRPC(ctx, srv, l)
		return errors.Join(err, <-done)
	}, nil
}

// copyListener serves NodeCopy on --node-copy-address; nil without copies.
func copyListener(o *NodeOptions, agent *channel.Agent, copies *peercopy.Server) (func(context.Context) error, error) {
	if copies == nil {
		return nil, nil
	}
	tlsCfg, err := agent.CopyTLS()
	if err != nil {
		return nil, fmt.Errorf("--node-copy-address: %w", err)
	}
	return func(ctx context.Context) error {
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, "tcp", o.NodeChannel.CopyAddress)
		if err != nil {
			return fmt.Errorf("--node-copy-address %s: %w", o.NodeChannel.CopyAddress, err)
		}
		lim := copyPortLimits()
		klog.InfoS("Serving copies to other nodes", "address", l.Addr().String(), "maxConnections", lim.connections)
		return serveCopyPort(ctx, l, tlsCfg, copies, lim)
	}, nil
}

func serveCopyPort(ctx context.Context, l net.Listener, tlsCfg *tls.Config, copies nodeagentv1.NodeCopyServer, lim copyLimits) error {
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)), grpc.ConnectionTimeout(lim.handshake),
		grpc.MaxConcurrentStreams(lim.streams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: nodeChannelMinPing}))
	nodeagentv1.RegisterNodeCopyServer(srv, copies)
	return serveGRPC(ctx, srv, netutil.LimitListener(l, lim.connections))
}
