//go:build !nodeagent

package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/controller/kube"
	"github.com/carve-csi/carve/internal/controller/lostnodes"
	"github.com/carve-csi/carve/internal/controller/objects"
	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/version"
)

// runController serves the cluster-wide Identity, Controller and the
// NodeGetCapabilities csi-resizer needs, touching no LVM. With
// --node-channel-service it routes calls to the node agents and runs the
// cluster duties.
func runController(ctx context.Context, o *ControllerOptions) error {
	mm := newMetricsManager(o.DriverName, "controller")
	svc := csiserver.Services{
		// Routing serves CreateVolume, which needs the topology capability for
		// --strict-topology.
		Identity: csiserver.NewIdentityServer(csiserver.IdentityConfig{Name: o.DriverName, Version: version.Version,
			Topology: o.Route.Service != "", SnapshotMetadata: o.Route.Service != ""}),
		Controller: csiserver.ResizerOnlyController{},
		Node:       csiserver.ResizerOnlyNode{},
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		client kubernetes.Interface
		objs   *objects.Cache
	)
	if o.Route.Service != "" || o.LostNodesInterval > 0 {
		var err error
		if client, err = kube.Client(o.Kubeconfig, "carve-controller"); err != nil {
			return err
		}
		objs = objects.New(client, o.DriverName, ctx.Done())
		// The informers stop before Shutdown waits for them, also when
		// serve ends with an error.
		defer func() {
			cancel()
			objs.Shutdown()
		}()
	}
	var after, leading []func(context.Context) error
	if o.Route.Service != "" {
		r, err := startRoute(ctx, o, client, objs, mm.GetRegistry().Registerer())
		if err != nil {
			return err
		}
		svc.Controller = r.server
		svc.SnapshotMetadata = r.server.Metadata()
		after = append(after, r.run)
		leading = append(leading, r.leading...)
	} else if o.Audit.Interval > 0 {
		klog.InfoS("Not auditing the nodes' LVs: the audit reads them over the node channel, and --node-channel-service is empty")
	}
	if o.LostNodesInterval > 0 {
		run, err := lostNodesWatch(ctx, o, client, objs, mm.GetRegistry().Registerer())
		if err != nil {
			return err
		}
		leading = append(leading, run)
	}
	if len(leading) > 0 {
		after = append(after, func(ctx context.Context) error {
			return o.whileLeading(ctx, client, leaseName, func(ctx context.Context) error { return runAll(ctx, leading...) })
		})
	}
	return serve(ctx, &o.CommonOptions, svc, mm, func(context.Context) error { return nil }, after)
}

// lostNodesWatch builds the watch for deleted nodes' volumes.
func lostNodesWatch(ctx context.Context, o *ControllerOptions, client kubernetes.Interface, objs *objects.Cache,
	reg prometheus.Registerer) (func(context.Context) error, error) {
	rec, stop := kube.Recorder(ctx, client, "carve-controller", "")
	w := lostnodes.New(lostnodes.Config{Driver: o.DriverName, TopologyKey: topology.Key, Client: client, Objects: objs, Events: rec,
		Interval: o.LostNodesInterval, DeleteClaims: o.DeleteClaimsOfLostNodes, Grace: o.LostNodeGrace,
		DeleteRetained: o.DeleteRetainedClaimsOfLostNodes, Registerer: reg})
	return func(ctx context.Context) error {
		defer stop()
		return w.Run(ctx)
	}, nil
}
