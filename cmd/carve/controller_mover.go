//go:build !nodeagent

package main

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/internal/controller/kube"
	"github.com/carve-csi/carve/internal/controller/mover"
	"github.com/carve-csi/carve/internal/controller/objects"
	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/internal/topology"
)

// startMover builds the mover over the router; what it returns runs it.
func startMover(ctx context.Context, o *ControllerOptions, client kubernetes.Interface, objs *objects.Cache, srv *router.Server,
	reg prometheus.Registerer) (func(context.Context) error, error) {
	rec, stop := kube.Recorder(ctx, client, "carve-controller", "")
	m, err := mover.New(mover.Config{Client: client, Objects: objs, Driver: o.DriverName, TopologyKey: topology.Key,
		CapacityNamespace: o.Route.CapacityNamespace, Volumes: srv, CatchUp: srv, Events: rec, Registerer: reg, Retries: o.MoveRetries})
	if err != nil {
		stop()
		return nil, err
	}
	return func(ctx context.Context) error {
		defer stop()
		return m.Run(ctx)
	}, nil
}
