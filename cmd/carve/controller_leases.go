//go:build !nodeagent

package main

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/internal/controller/leader"
)

// The Leases of the controller's cluster duties: each duty runs in one
// replica at a time, the holder of its Lease, while every replica serves
// the CSI calls (two replicas would fight over the same objects, announce
// every finding twice and race through the same steps).
// docs/configuration.md (--leader-election) names them.
const (
	// leaseName: the leader's duties, together: the lost-node watch, the
	// placement of new restores and clones, the audit and the mover.
	leaseName = "carve-controller"
	// capacityLease: the CSIStorageCapacity writer leads apart: its
	// leader hands the Lease over when it reaches too few of the nodes
	// (another replica may reach them), which must not stop a move or the
	// audit.
	capacityLease = "carve-controller-capacity"
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
