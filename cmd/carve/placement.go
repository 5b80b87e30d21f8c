//go:build !nodeagent

package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/pkg/kube"
	"github.com/carve-csi/carve/pkg/leader"
	"github.com/carve-csi/carve/pkg/placement"
	"github.com/carve-csi/carve/topology"
)

// placementLease is the Lease of the replica that selects the node of new
// restores and clones: two replicas would only decide the same twice.
const placementLease = "carve-controller-placement"

// startPlacement builds the placement of restores and clones on their
// source's node (pkg/placement) from the node channel's capacity reports
// and PV index; what it returns runs it, under leader election when asked.
func startPlacement(ctx context.Context, o *ControllerOptions, client kubernetes.Interface, capacity placement.Capacity,
	pvs placement.PVs, reg prometheus.Registerer) (func(context.Context) error, error) {
	dyn, err := kube.Dynamic(o.Kubeconfig, "carve-controller")
	if err != nil {
		return nil, fmt.Errorf("the placement of restores: %w", err)
	}
	rec, stop := kube.Recorder(ctx, client, "carve-controller", "")
	p, err := placement.New(placement.Config{Client: client, Dynamic: dyn, Driver: o.DriverName, TopologyKey: topology.Key,
		Capacity: capacity, PVs: pvs, Events: rec, Registerer: reg})
	if err != nil {
		stop()
		return nil, err
	}
	return func(ctx context.Context) error {
		defer stop()
		if !o.LeaderElection {
			return p.Run(ctx)
		}
		return leader.Run(ctx, leader.Config{Client: client, Namespace: o.LeaderElectionNamespace, Lease: placementLease}, p.Run)
	}, nil
}
