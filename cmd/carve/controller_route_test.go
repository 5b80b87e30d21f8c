//go:build !nodeagent

package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/controller/objects"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/capacity"
	"github.com/carve-csi/carve/internal/topology"
)

// TestRunAll: one part failing stops the others and is reported; parts
// that end because the others were stopped are not errors.
func TestRunAll(t *testing.T) {
	boom := errors.New("boom")
	untilDone := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	tests := []struct {
		name string
		fns  []func(context.Context) error
		want error
	}{
		{"one fails", []func(context.Context) error{untilDone, func(context.Context) error { return boom }, untilDone}, boom},
		{"all end well", []func(context.Context) error{func(context.Context) error { return nil }, untilDone}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := runAll(context.Background(), tt.fns...)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("runAll = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestCapacityLeaderGivesUpTheLease: a capacity writer whose nodes all
// drop holds its deletions, then ends its term: the Lease is released
// for a replica that may reach the nodes, the controller goes on (no
// error), and the replica stands for the Lease again later.
func TestCapacityLeaderGivesUpTheLease(t *testing.T) {
	const ns = "carve-system"
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	client := fake.NewClientset(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"},
		Provisioner: "lvm.carve.dev", VolumeBindingMode: &wffc})
	objs := objects.New(client, "lvm.carve.dev", t.Context().Done())
	t.Cleanup(objs.Shutdown)
	w, err := capacity.New(capacity.Config{Client: client, Namespace: ns, Driver: "lvm.carve.dev",
		TopologyKey: topology.Key, StartupGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	o := &ControllerOptions{LeaderElection: true, LeaderElectionNamespace: ns}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- o.leadCapacity(ctx, client, w, 500*time.Millisecond) }()

	holder := func() string {
		l, err := client.CoordinationV1().Leases(ns).Get(ctx, capacityLease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	written := func() int {
		l, err := client.StorageV1().CSIStorageCapacities(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
			select {
			case err := <-done:
				t.Fatalf("leadCapacity returned %v while %s", err, what)
			default:
			}
		}
	}
	eventually("leading", func() bool { return holder() != "" })
	for _, n := range []string{"node-a", "node-b"} {
		w.Report(n, &nodeagentv1.CapacityReport{Classes: []*nodeagentv1.ClassCapacity{
			{DeviceClass: "ssd", AvailableBytes: 1 << 30, MaximumVolumeBytes: 1 << 30, IsDefault: true}}})
	}
	eventually("objects written", func() bool { return written() == 2 })
	w.Report("node-a", nil)
	w.Report("node-b", nil)
	eventually("the Lease released", func() bool { return holder() == "" })
	if n := written(); n != 2 {
		t.Errorf("%d objects left, want both kept", n)
	}
	eventually("leading again", func() bool { return holder() != "" })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("leadCapacity = %v, want nil once its context ended", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("leadCapacity still runs 10 s after its context ended")
	}
}
