package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/pkg/driver"
	"github.com/carve-csi/carve/pkg/kube"
	"github.com/carve-csi/carve/pkg/lostnodes"
	"github.com/carve-csi/carve/pkg/version"
	"github.com/carve-csi/carve/topology"
)

// leaseName is the Lease the controller replicas compete for.
const leaseName = "carve-controller"

// runController serves the cluster-wide Identity, Controller and the one
// Node call (NodeGetCapabilities) that csi-resizer needs, and watches for
// the volumes of deleted nodes; it touches no LVM.
func runController(ctx context.Context, o *ControllerOptions) error {
	mm := newMetricsManager(o.DriverName, "controller")
	svc := driver.Services{
		Identity:   driver.NewIdentityServer(driver.IdentityConfig{Name: o.DriverName, Version: version.Version}),
		Controller: driver.CentralControllerServer{},
		Node:       driver.CentralNodeServer{},
	}
	var after []func(context.Context) error
	if o.LostNodesInterval > 0 {
		run, err := lostNodesWatch(ctx, o, mm.GetRegistry().Registerer())
		if err != nil {
			return err
		}
		after = append(after, run)
	}
	return serve(ctx, &o.CommonOptions, svc, mm, func(context.Context) error { return nil }, after)
}

// lostNodesWatch builds the watch for the volumes of deleted nodes, run
// under leader election.
func lostNodesWatch(ctx context.Context, o *ControllerOptions, reg prometheus.Registerer) (func(context.Context) error, error) {
	client, err := kube.Client(o.Kubeconfig, "carve-controller")
	if err != nil {
		return nil, fmt.Errorf("the lost-node watch (--lost-nodes-interval=0 turns it off): %w", err)
	}
	rec, stop := kube.Recorder(ctx, client, "carve-controller", "")
	w := lostnodes.New(lostnodes.Config{Driver: o.DriverName, TopologyKey: topology.Key, Client: client, Events: rec,
		Interval: o.LostNodesInterval, DeleteClaims: o.DeleteClaimsOfLostNodes, Registerer: reg})
	return func(ctx context.Context) error {
		defer stop()
		if !o.LeaderElection {
			return w.Run(ctx)
		}
		return leading(ctx, client, o.LeaderElectionNamespace, w.Run)
	}, nil
}

// leading runs run while this replica holds the Lease, until ctx ends.
// Losing the Lease ends the process's duty: it returns an error, and the
// controller exits to start over as a follower.
func leading(ctx context.Context, client kubernetes.Interface, namespace string, run func(context.Context) error) error {
	if namespace == "" {
		data, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		if err != nil {
			return fmt.Errorf("--leader-election-namespace is empty and the pod's namespace is unknown: %w", err)
		}
		namespace = strings.TrimSpace(string(data))
	}
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("leader election identity: %w", err)
	}
	id := host + "_" + uuid.NewString()
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: namespace, Name: leaseName},
		Client: client.CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: id}}
	done := make(chan error, 1)
	var led, lost atomic.Bool
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		Name: leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				klog.FromContext(ctx).Info("Leading: watching for the volumes of deleted nodes", "lease", namespace+"/"+leaseName, "identity", id)
				led.Store(true)
				done <- run(ctx)
			},
			OnStoppedLeading: func() { lost.Store(ctx.Err() == nil) },
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	le.Run(ctx)
	if led.Load() {
		if err := <-done; err != nil {
			return err
		}
	}
	if lost.Load() {
		return fmt.Errorf("lost the Lease %s/%s", namespace, leaseName)
	}
	return nil
}
