package leader

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestRun: the holder runs its duty and records itself in the Lease; a
// second replica waits, and takes over once the first one's context ends
// (it releases the Lease on the way out).
func TestRun(t *testing.T) {
	client := fake.NewClientset()
	cfg := func(id string) Config {
		return Config{Client: client, Namespace: "carve", Lease: "carve-controller", Identity: id,
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}
	}
	// lead runs Run as id in the background with a duty that leads until
	// its context ends, then answers end.
	lead := func(ctx context.Context, id string, end error) (leading chan struct{}, done chan error) {
		leading, done = make(chan struct{}), make(chan error, 1)
		go func() {
			done <- Run(ctx, cfg(id), func(ctx context.Context) error {
				close(leading)
				<-ctx.Done()
				return end
			})
		}()
		return leading, done
	}
	ctxA, stopA := context.WithCancel(context.Background())
	leadingA, doneA := lead(ctxA, "a", nil)
	<-leadingA
	lease, err := client.CoordinationV1().Leases("carve").Get(context.Background(), "carve-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := *lease.Spec.HolderIdentity; got != "a" {
		t.Errorf("the Lease is held by %q, want a", got)
	}

	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	leadingB, doneB := lead(ctxB, "b", errors.New("b's duty ended"))
	select {
	case <-leadingB:
		t.Fatal("b leads while a holds the Lease")
	case <-time.After(500 * time.Millisecond):
	}
	stopA()
	if err := <-doneA; err != nil {
		t.Errorf("a ended with %v, want nil (its context ended)", err)
	}
	<-leadingB
	stopB()
	if err := <-doneB; err == nil || err.Error() != "b's duty ended" {
		t.Errorf("b ended with %v, want its duty's error", err)
	}
}

// TestRunEndsWithAFailedDuty: a duty that fails ends Run at once with its
// error and releases the Lease, so that another replica may lead.
func TestRunEndsWithAFailedDuty(t *testing.T) {
	client := fake.NewClientset()
	cfg := Config{Client: client, Namespace: "carve", Lease: "carve-controller", Identity: "a",
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, func(context.Context) error { return errors.New("the duty failed") }) }()
	if err := <-done; err == nil || err.Error() != "the duty failed" {
		t.Errorf("Run = %v, want the duty's error", err)
	}
	lease, err := client.CoordinationV1().Leases("carve").Get(context.Background(), "carve-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("the Lease is still held by %q after the duty failed", *h)
	}
}

// TestCompleteDefaults: a config without timings gets client-go's usual
// ones and an identity of its own.
func TestCompleteDefaults(t *testing.T) {
	cfg := Config{Namespace: "carve", Lease: "l"}
	if err := cfg.complete(); err != nil {
		t.Fatal(err)
	}
	if cfg.LeaseDuration != 15*time.Second || cfg.RenewDeadline != 10*time.Second || cfg.RetryPeriod != 2*time.Second {
		t.Errorf("timings %v %v %v, want 15s 10s 2s", cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod)
	}
	other := Config{Namespace: "carve", Lease: "l"}
	if err := other.complete(); err != nil {
		t.Fatal(err)
	}
	if cfg.Identity == "" || cfg.Identity == other.Identity {
		t.Errorf("identities %q and %q, want two different ones", cfg.Identity, other.Identity)
	}
}
