//go:build !nodeagent

package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/internal/controller/audit"
	"github.com/carve-csi/carve/internal/controller/kube"
	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/topology"
)

// startAudit builds the audit of the nodes' LVs (and, with dyn, snapshots);
// what it returns runs it until ctx ends.
func startAudit(ctx context.Context, o *ControllerOptions, client kubernetes.Interface, dyn dynamic.Interface, pvs *pvindex.Index, pool audit.Agents,
	reg prometheus.Registerer) func(context.Context) error {
	rec, stop := kube.Recorder(ctx, client, "carve-controller", "")
	cfg := audit.Config{Driver: o.DriverName, TopologyKey: topology.Key, Client: client, PVs: pvs,
		Nodes: audit.AgentNodes{Pool: pool}, Grace: o.Audit.Grace, RemovalGrace: o.Audit.RemovalGrace, Interval: o.Audit.Interval, RemoveOrphans: o.Audit.RemoveOrphans,
		Registerer: reg, Events: rec}
	if dyn != nil {
		cfg.Contents = audit.DynamicContents{Dyn: dyn, Driver: o.DriverName}
	}
	a := audit.New(cfg)
	return func(ctx context.Context) error {
		defer stop()
		if err := a.Run(ctx); err != nil {
			return fmt.Errorf("the audit: %w", err)
		}
		return nil
	}
}
