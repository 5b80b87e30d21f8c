package main

import (
	"context"
	"fmt"
	"net"
	"time"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/driver"
	"github.com/carve-csi/carve/pkg/nodeagent"
	"github.com/carve-csi/carve/pkg/nodeca"
	"github.com/carve-csi/carve/pkg/vgview"
)

// Keepalive of the node channel: the agent pings an idle controller so
// that a stream to a controller that vanished ends, and lets the
// controller ping as often as every nodeChannelMinPing (a client pinging
// more often is cut off by gRPC with "too many pings"; the controller pings
// every 10 s, and half that leaves room for timer jitter).
const (
	nodeChannelPing    = 30 * time.Second
	nodeChannelMinPing = 5 * time.Second
)

// nodeChannel builds the node channel: the node agent and a TLS gRPC
// server with the plugin's Identity and Controller servers (the same
// ones its socket serves) and NodeAgent (its inventory and orphan removal
// over orphans, the provisioner), under the socket's interceptors
// and metrics. What it returns listens on --node-channel-address and
// serves until ctx ends.
func nodeChannel(o *PluginOptions, cfg *config.Config, view *vgview.View, orphans nodeagent.Orphans, svc driver.Services,
	mm csimetrics.CSIMetricsManager) (func(context.Context) error, error) {
	bundle := nodeca.NewBundleFile(o.NodeChannel.CAFile)
	agent, err := nodeagent.New(nodeagent.Config{NodeName: o.NodeName, TokenFile: o.NodeChannel.TokenFile,
		Trust: bundle.Pool(), Classes: cfg, Capacity: view, Inventory: view, Orphans: orphans})
	if err != nil {
		return nil, fmt.Errorf("the node channel: %w", err)
	}
	tlsCfg, err := agent.ServerTLS()
	if err != nil {
		return nil, fmt.Errorf("the node channel: %w", err)
	}
	srv := driver.NewGRPCServer(driver.Services{Identity: svc.Identity, Controller: svc.Controller}, mm,
		driver.WithGRPCOptions(grpc.Creds(credentials.NewTLS(tlsCfg)),
			grpc.KeepaliveParams(keepalive.ServerParameters{Time: nodeChannelPing, Timeout: nodeChannelMinPing}),
			grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: nodeChannelMinPing, PermitWithoutStream: true})),
		driver.WithServices(func(r grpc.ServiceRegistrar) { nodeagentv1.RegisterNodeAgentServer(r, agent) }),
		driver.WithUnloggedPayloads(nodeagent.UnloggedMethods()...))
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
		return serveGRPC(ctx, srv, l)
	}, nil
}
