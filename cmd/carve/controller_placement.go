//go:build !nodeagent

package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/internal/controller/kube"
	"github.com/carve-csi/carve/internal/controller/objects"
	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/internal/topology"
)

// startPlacement builds the placement of restores and clones; what it
// returns runs it.
func startPlacement(ctx context.Context, o *ControllerOptions, client kubernetes.Interface, objs *objects.Cache, capacity placement.Capacity,
	pvs placement.PVs, reg prometheus.Registerer) (func(context.Context) error, error) {
	dyn, err := kube.Dynamic(o.Kubeconfig, "carve-controller")
	if err != nil {
		return nil, fmt.Errorf("the placement of restores: %w", err)
	}
	rec, stop := kube.Recorder(ctx, client, "carve-controller", "")
	p, err := placement.New(placement.Config{Client: client, Objects: objs, Dynamic: dyn, Driver: o.DriverName, TopologyKey: topology.Key,
		Capacity: capacity, PVs: pvs, Events: rec, Registerer: reg})
	if err != nil {
		stop()
		return nil, err
	}
	return func(ctx context.Context) error {
		defer stop()
		return p.Run(ctx)
	}, nil
}
