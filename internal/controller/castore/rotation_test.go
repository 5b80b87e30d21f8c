package castore

import (
	"context"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/carve-csi/carve/internal/nodeca"
)

func TestPlan(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// A CA of 90 days from t0 (NotBefore is backdated a few minutes).
	ca := newCA(t, nodeca.CAOptions{Now: fixed(t0), Validity: 90 * 24 * time.Hour})
	next := newCA(t, nodeca.CAOptions{Now: fixed(t0.Add(60 * 24 * time.Hour)), Validity: 90 * 24 * time.Hour})
	day := 24 * time.Hour
	p := Policy{}.withDefaults()
	tests := []struct {
		name        string
		st          State
		at          time.Duration // after t0
		nextTrusted bool
		want        step
	}{
		{"young CA: nothing", State{Active: ca}, 10 * day, false, stepNone},
		{"two thirds of its life gone: stage", State{Active: ca}, 61 * day, false, stepStage},
		{"asked for: stage", State{Active: ca, RotateRequested: true}, day, false, stepStage},
		{"staged, no agent answered yet: wait", State{Active: ca, Next: next, NextSince: t0.Add(61 * day)}, 61*day + time.Minute, false, stepNone},
		{"staged, every agent accepts: switch", State{Active: ca, Next: next, NextSince: t0.Add(61 * day)}, 61*day + time.Minute, true, stepSwitch},
		{"staged past the propagation: switch", State{Active: ca, Next: next, NextSince: t0.Add(61 * day)}, 61*day + p.Propagation, false, stepSwitch},
		{"staged, the CA near its end: switch", State{Active: ca, Next: next, NextSince: t0.Add(61 * day)}, 76 * day, false, stepSwitch},
		{"previous still trusted: nothing", State{Active: ca, Previous: next.Cert, PreviousUntil: t0.Add(2 * day)}, day, false, stepNone},
		{"previous past its leaves: drop", State{Active: ca, Previous: next.Cert, PreviousUntil: t0.Add(2 * day)}, 2 * day, false, stepDrop},
		{"asked for while the previous is trusted: wait for the drop", State{Active: ca, Previous: next.Cert, PreviousUntil: t0.Add(2 * day), RotateRequested: true}, day, false, stepNone},
		{"expired: replace", State{Active: ca}, 91 * day, false, stepReplaced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := plan(tt.st, t0.Add(tt.at), p, tt.nextTrusted); got != tt.want {
				t.Errorf("plan = %q, want %q", got, tt.want)
			}
		})
	}
}

func fixed(t time.Time) func() time.Time { return func() time.Time { return t } }

// clock is a settable time for a Store.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func trustedIn(t *testing.T, client *fake.Clientset) []*x509.Certificate {
	t.Helper()
	certs, err := nodeca.ParseBundle([]byte(bundle(t, client)))
	if err != nil {
		t.Fatal(err)
	}
	return certs
}

// TestRotation takes a CA through a whole rotation with two replicas
// reading one Secret: every step is seen alike by both, the ConfigMap
// trusts the next CA before it signs, the old one stays trusted while its
// leaves live, and the metrics follow.
func TestRotation(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	clk := &clock{now: time.Now()}
	const validity = 30 * time.Minute
	accepted := errors.New("node-a: bad certificate")
	newStore := func(reg prometheus.Registerer) *Store {
		s, err := New(Config{Client: client, Namespace: ns, Name: name, Now: clk.Now, Registerer: reg,
			Policy:   Policy{Validity: validity, Propagation: time.Hour, Overlap: 2 * time.Minute},
			Accepted: func(context.Context, *nodeca.CA) error { return accepted }})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	reg := prometheus.NewPedanticRegistry()
	a, b := newStore(reg), newStore(nil)
	first, err := a.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if other, err := b.Start(ctx); err != nil || !SameCA(other.Active, first.Active) {
		t.Fatalf("the second replica: %v, same CA %v", err, SameCA(other.Active, first.Active))
	}
	sync := func(s *Store) State {
		t.Helper()
		st, err := s.sync(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	clk.now = clk.now.Add(validity / 2)
	if st := sync(a); st.Next != nil {
		t.Fatal("staged with half the CA's life left")
	}
	clk.now = clk.now.Add(validity / 4) // a quarter left
	staged := sync(a)
	if staged.Next == nil || !SameCA(staged.Active, first.Active) {
		t.Fatalf("not staged with a quarter of the life left: %+v", staged)
	}
	if got := trustedIn(t, client); len(got) != 2 || !got[1].Equal(staged.Next.Cert) {
		t.Fatalf("the ConfigMap does not trust the next CA beside the current one: %d CAs", len(got))
	}
	if st := sync(b); !SameCA(st.Next, staged.Next) {
		t.Fatal("the other replica does not see the staged CA")
	}
	if st := sync(a); st.Next == nil {
		t.Fatal("switched while an agent refuses the next CA")
	}
	accepted = nil
	switched := sync(b) // either replica may take the step
	if !SameCA(switched.Active, staged.Next) || switched.Previous == nil || !switched.Previous.Equal(first.Active.Cert) {
		t.Fatalf("not switched once every agent accepts: %+v", switched)
	}
	if st := sync(a); !SameCA(st.Active, switched.Active) {
		t.Fatal("the other replica does not see the switch")
	}
	if got := trustedIn(t, client); len(got) != 2 || !got[0].Equal(switched.Active.Cert) || !got[1].Equal(first.Active.Cert) {
		t.Fatal("after the switch the ConfigMap must trust the new CA and the old one while its leaves live")
	}
	clk.now = clk.now.Add(time.Minute)
	if st := sync(a); st.Previous == nil {
		t.Fatal("the old CA dropped before the overlap ended")
	}
	clk.now = clk.now.Add(time.Minute)
	if st := sync(a); st.Previous != nil {
		t.Fatal("the old CA is still trusted after its leaves expired")
	}
	if got := trustedIn(t, client); len(got) != 1 || !got[0].Equal(switched.Active.Cert) {
		t.Fatal("the ConfigMap still trusts the old CA")
	}
	for step, want := range map[step]float64{stepStage: 1, stepSwitch: 0, stepDrop: 1} {
		if got := testutil.ToFloat64(a.rotations.WithLabelValues(string(step))); got != want {
			t.Errorf("replica a's rotations{step=%s} = %v, want %v", step, got, want)
		}
	}
	if got := testutil.ToFloat64(a.expiry.WithLabelValues("active")); got != float64(switched.Active.Cert.NotAfter.Unix()) {
		t.Errorf("active CA expiry metric %v, want %v", got, switched.Active.Cert.NotAfter.Unix())
	}
	if n := testutil.CollectAndCount(a.expiry); n != 1 {
		t.Errorf("%d CA expiry series after the rotation, want 1 (active)", n)
	}
}

// TestRotateOnDemand: the annotation stages a next CA at once and is
// removed, so it is not taken twice.
func TestRotateOnDemand(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	s, err := New(Config{Client: client, Namespace: ns, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	sec, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Annotations[RotateAnnotation] = "now"
	if _, err := client.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := s.sync(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if st.Next == nil || st.RotateRequested {
		t.Fatalf("asked for a rotation: next staged %v, request still pending %v", st.Next != nil, st.RotateRequested)
	}
}

// TestExpiredCAIsReplaced: a controller that was down across its CA's
// end replaces it at start; nothing the old one signed verifies anyway.
func TestExpiredCAIsReplaced(t *testing.T) {
	ctx := context.Background()
	expired := newCA(t, nodeca.CAOptions{Now: fixed(time.Now().Add(-48 * time.Hour)), Validity: time.Hour})
	client := fake.NewClientset(caSecret(t, expired))
	got, err := start(ctx, client, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if SameCA(got, expired) || !time.Now().Before(got.Cert.NotAfter) {
		t.Fatal("kept the expired CA")
	}
	if certs := trustedIn(t, client); len(certs) != 1 || !certs[0].Equal(got.Cert) {
		t.Fatal("the ConfigMap does not trust exactly the new CA")
	}
}
