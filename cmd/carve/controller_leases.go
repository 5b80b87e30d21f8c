//go:build !nodeagent

package main

import (
	"context"

	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/internal/controller/leader"
)

// The Leases of the controller's cluster duties: each runs in one replica
// at a time, or replicas would fight over the same objects and announce
// every finding twice; every replica serves the CSI calls.
const (
	// leaseName: the lost-node watch, placement, the audit and the mover.
	leaseName = "carve-controller"
	// capacityLease: the capacity writer leads apart, since its leader hands
	// the Lease over when it reaches too few nodes, which must not stop a move.
	capacityLease = "carve-controller-capacity"
)

// whileLeading runs duty until ctx ends, with --leader-election only while
// holding lease (losing it returns an error, so the controller restarts as
// a follower).
func (o *ControllerOptions) whileLeading(ctx context.Context, client kubernetes.Interface, lease string,
	duty func(context.Context) error) error {
	if !o.LeaderElection {
		return duty(ctx)
	}
	return leader.Run(ctx, leader.Config{Client: client, Namespace: o.LeaderElectionNamespace, Lease: lease}, duty)
}
