// Package leader runs a duty in one replica of carve's controller at a
// time, the holder of a Kubernetes Lease.
package leader

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

const namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Config names the Lease and how this replica holds it.
type Config struct {
	// Client reaches the API server.
	Client kubernetes.Interface
	// Namespace holds the Lease; empty is the pod's own namespace.
	Namespace string
	// Lease is the Lease's name, the same in every replica.
	Lease string
	// Identity names this replica; empty is the host name and a random suffix,
	// so a restarted pod is a new holder.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's; zero is
	// 15 s, 10 s and 2 s.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Run runs duty while holding the Lease, until ctx ends or duty returns, then releases it
// and returns duty's error. Losing the Lease returns an error: the caller exits and
// starts over as a follower.
func Run(ctx context.Context, cfg Config, duty func(context.Context) error) error {
	if err := cfg.complete(); err != nil {
		return err
	}
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Lease},
		Client: cfg.Client.CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity}}
	term, end := context.WithCancel(ctx)
	defer end()
	done := make(chan error, 1)
	var led, lost atomic.Bool
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: cfg.Lease,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				klog.FromContext(ctx).Info("Leading", "lease", cfg.Namespace+"/"+cfg.Lease, "identity", cfg.Identity)
				led.Store(true)
				done <- duty(ctx)
				end() // the duty is over: release the Lease
			},
			OnStoppedLeading: func() { lost.Store(term.Err() == nil) },
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	le.Run(term)
	if led.Load() {
		if err := <-done; err != nil {
			return err
		}
	}
	if lost.Load() {
		return fmt.Errorf("lost the Lease %s/%s", cfg.Namespace, cfg.Lease)
	}
	return nil
}

func (cfg *Config) complete() error {
	if cfg.Namespace == "" {
		data, err := os.ReadFile(namespaceFile)
		if err != nil {
			return fmt.Errorf("the Lease's namespace is not set and the pod's namespace is unknown: %w", err)
		}
		cfg.Namespace = strings.TrimSpace(string(data))
	}
	if cfg.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("leader election identity: %w", err)
		}
		cfg.Identity = host + "_" + uuid.NewString()
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.LeaseDuration, 15 * time.Second}, {&cfg.RenewDeadline, 10 * time.Second}, {&cfg.RetryPeriod, 2 * time.Second}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	return nil
}
