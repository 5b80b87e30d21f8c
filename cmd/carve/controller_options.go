//go:build !nodeagent

package main

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// ControllerOptions configure the `carve controller` role.
type ControllerOptions struct {
	CommonOptions
	// Kubeconfig is the API server's kubeconfig; empty uses the service account.
	Kubeconfig string
	// LostNodesInterval is how often deleted nodes' PVs are looked for; 0 turns
	// the watch off (and, without routing, every API access).
	LostNodesInterval time.Duration
	// DeleteClaimsOfLostNodes deletes lost nodes' claims and PVs after
	// LostNodeGrace instead of only reporting them.
	DeleteClaimsOfLostNodes bool
	// LostNodeGrace is how long a Node must be absent before its claims go.
	LostNodeGrace time.Duration
	// DeleteRetainedClaimsOfLostNodes includes Retain PVs.
	DeleteRetainedClaimsOfLostNodes bool
	// LeaderElection makes one replica at a time do each cluster duty
	// (leases.go names the Leases).
	LeaderElection bool
	// LeaderElectionNamespace holds the Leases; empty is the pod's namespace.
	LeaderElectionNamespace string
	// MoveRetries is how often a stopped workload's move step is retried.
	MoveRetries int
	// Route configures routing to the node agents over the node channel.
	Route RouteOptions
	// Audit configures the comparison of the nodes' LVs with carve's PVs.
	Audit AuditOptions
}

// AddFlags registers the controller flags on fs.
func (o *ControllerOptions) AddFlags(fs *flag.FlagSet) {
	o.CommonOptions.AddFlags(fs)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server; empty uses the pod's service account")
	fs.DurationVar(&o.LostNodesInterval, "lost-nodes-interval", time.Minute, "how often the PersistentVolumes of deleted Nodes are looked for (also at every Node deletion); 0 turns the watch off (without --node-channel-service, all API access too)")
	fs.BoolVar(&o.DeleteClaimsOfLostNodes, "delete-claims-of-lost-nodes", false, "delete the claims and PersistentVolumes pinned to a deleted Node (so that a StatefulSet makes new volumes elsewhere) instead of only reporting them, once the Node has been absent for --lost-node-grace-period; PersistentVolumes whose reclaim policy is Retain only with --delete-retained-claims-of-lost-nodes")
	fs.DurationVar(&o.LostNodeGrace, "lost-node-grace-period", 30*time.Minute, "with --delete-claims-of-lost-nodes: how long a Node must have been absent, from when carve controller first found it absent, before the claims and PersistentVolumes pinned to it are deleted; a Node that comes back within it keeps them (a new leader starts the clock anew)")
	fs.BoolVar(&o.DeleteRetainedClaimsOfLostNodes, "delete-retained-claims-of-lost-nodes", false, "with --delete-claims-of-lost-nodes: delete also the claims and PersistentVolumes whose reclaim policy is Retain (without it they are only reported)")
	fs.BoolVar(&o.LeaderElection, "leader-election", true, "only the replica holding the Lease carve-controller watches for lost nodes, selects the node of new restores and clones, audits the nodes' LVs and moves claims to other nodes, and only the holder of carve-controller-capacity writes CSIStorageCapacity objects")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the Lease; empty is the pod's own namespace")
	fs.IntVar(&o.MoveRetries, "move-retries", 40, "how often a move (kubectl carve move, drain) retries a failing step once its workload stopped, each after a backoff doubling from 1s to 1m (40: about 35 minutes), before it gives up: it rolls back, or parks when the old volume's node does not vouch for it")
	o.Route.AddFlags(fs)
	o.Audit.AddFlags(fs)
}

// Validate checks the controller flags.
func (o *ControllerOptions) Validate() error {
	errs := []error{o.CommonOptions.Validate()}
	if o.LostNodesInterval < 0 || o.LostNodesInterval > 0 && o.LostNodesInterval < time.Second {
		errs = append(errs, fmt.Errorf("--lost-nodes-interval %v: must be 0 (off) or at least 1s", o.LostNodesInterval))
	}
	if o.DeleteClaimsOfLostNodes && o.LostNodesInterval == 0 {
		errs = append(errs, errors.New("--delete-claims-of-lost-nodes: needs the watch (--lost-nodes-interval > 0)"))
	}
	if o.LostNodeGrace < time.Second {
		errs = append(errs, fmt.Errorf("--lost-node-grace-period %v: must be at least 1s", o.LostNodeGrace))
	}
	if o.MoveRetries < 1 {
		errs = append(errs, fmt.Errorf("--move-retries %d: must be at least 1", o.MoveRetries))
	}
	if o.DeleteRetainedClaimsOfLostNodes && !o.DeleteClaimsOfLostNodes {
		errs = append(errs, errors.New("--delete-retained-claims-of-lost-nodes: needs --delete-claims-of-lost-nodes"))
	}
	errs = append(errs, o.Route.Validate(), o.Audit.Validate(o.Route.Service != ""))
	return errors.Join(errs...)
}

// AuditOptions configure the audit of the nodes' LVs against carve's PVs
// (docs/operations.md).
type AuditOptions struct {
	// Interval is how often the audit runs; 0 turns it off. It needs the node
	// channel, which carries the inventories.
	Interval time.Duration
	// Grace is how long an LV must lack a PV (or a PV its LV) before it is
	// reported: longer than a CreateVolume and its PV write, and than a PV's
	// absence while it is restored by hand.
	Grace time.Duration
	// RemovalGrace is how long an orphan stays quarantined before removal.
	RemovalGrace time.Duration
	// RemoveOrphans quarantines reported orphans and removes them later.
	RemoveOrphans bool
}

// AddFlags registers the audit flags on fs.
func (o *AuditOptions) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.Interval, "audit-interval", time.Minute, "how often every node's carve LVs are compared with carve's PersistentVolumes (orphans, missing data), over the node channel; 0 turns the audit off")
	fs.DurationVar(&o.Grace, "orphan-grace-period", 6*time.Hour, "how long an LV must have no PersistentVolume (or a PersistentVolume its LV) before it is reported, and with --remove-orphans quarantined; in-flight provisioning is never counted")
	fs.DurationVar(&o.RemovalGrace, "orphan-removal-grace-period", 7*24*time.Hour, "with --remove-orphans: how long a quarantined orphan (deactivated, renamed carve-orphan-<hex>, data kept) must stay unclaimed before it is removed; a PersistentVolume naming it keeps it")
	fs.BoolVar(&o.RemoveOrphans, "remove-orphans", false, "quarantine an orphaned LV with a claim tag (no PersistentVolume for --orphan-grace-period, and its claim gone: deactivated and renamed carve-orphan-<hex>, restorable with lvrename), through its node's agent, and remove it after --orphan-removal-grace-period, instead of only reporting it; an LV without a claim tag is never touched")
}

// Validate checks the audit flags; routing says the node channel is on.
func (o *AuditOptions) Validate(routing bool) error {
	var errs []error
	if o.Interval < 0 || o.Interval > 0 && o.Interval < time.Second {
		errs = append(errs, fmt.Errorf("--audit-interval %v: must be 0 (off) or at least 1s", o.Interval))
	}
	if o.Grace < time.Second {
		errs = append(errs, fmt.Errorf("--orphan-grace-period %v: must be at least 1s", o.Grace))
	}
	if o.RemovalGrace < time.Second {
		errs = append(errs, fmt.Errorf("--orphan-removal-grace-period %v: must be at least 1s", o.RemovalGrace))
	}
	switch {
	case o.RemoveOrphans && o.Interval == 0:
		errs = append(errs, errors.New("--remove-orphans: needs the audit (--audit-interval > 0)"))
	case o.RemoveOrphans && !routing:
		errs = append(errs, errors.New("--remove-orphans: needs the node channel (--node-channel-service): orphans are removed through their node's agent"))
	}
	return errors.Join(errs...)
}
