//go:build !nodeagent

package main

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/internal/controller/leader"
)

// The Leases of the controller's cluster duties: each duty runs in one
// replica at a time, the holder of its Lease, while every replica serves
// the CSI calls. docs/configuration.md (--leader-election) names them.
const (
	// leaseName: the lost-node watch.
	leaseName = "carve-controller"
	// capacityLease: the CSIStorageCapacity writer; two replicas writing
	// the same objects would only fight.
	capacityLease = "carve-controller-capacity"
	// placementLease: the node of new restores and clones; two replicas
	// would only decide the same twice.
	placementLease = "carve-controller-placement"
	// auditLease: the audit of the nodes; two replicas would announce
	// every finding twice and race to remove orphans.
	auditLease = "carve-controller-audit"
	// moverLease: moves of claims to other nodes (kubectl carve move);
	// two would race through the same steps.
	moverLease = "carve-controller-mover"
)

// whileLeading runs duty until ctx ends: with --leader-election only while
// this replica holds lease (losing it ends duty and returns an error, so
// that the controller exits and starts over as a follower), without it at
// once.
func (o *ControllerOptions) whileLeading(ctx context.Context, client kubernetes.Interface, lease string,
	duty func(context.Context) error) error {
	if !o.LeaderElection {
		return duty(ctx)
	}
	return leader.Run(ctx, leader.Config{Client: client, Namespace: o.LeaderElectionNamespace, Lease: lease}, duty)
}
