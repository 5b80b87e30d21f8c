package agents

import (
	"crypto/x509"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/carve-csi/carve/internal/nodeca"
)

// chainsTo reports whether leaf was signed by ca.
func chainsTo(leaf *x509.Certificate, ca *nodeca.CA) bool {
	return leaf != nil && leaf.CheckSignatureFrom(ca.Cert) == nil
}

// TestCASwitch: Accepts says whether the agents take a certificate of the
// next CA (the agent trusts it only once its bundle holds it); Reissue,
// once the next CA signs, gives the controller and every agent a
// certificate of it, and the calls go on once the old CA is no longer
// trusted.
func TestCASwitch(t *testing.T) {
	const node = "node-a"
	e, f := runOneAgent(t, node)
	eventually(t, "a verified connection", func() bool { return e.lastErr(node) == nil })
	next, err := nodeca.NewCA(nodeca.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.pool.Accepts(t.Context(), next); err == nil {
		t.Fatal("Accepts = nil before the agent trusts the next CA")
	}
	e.trust.Set(e.ca.Cert, next.Cert) // the bundle, on both sides
	if err := e.pool.Accepts(t.Context(), next); err != nil {
		t.Fatalf("Accepts once the agent trusts the next CA: %v", err)
	}
	// An agent seen to accept the CA is not asked again.
	asked := f.infos.Load()
	if err := e.pool.Accepts(t.Context(), next); err != nil || f.infos.Load() != asked {
		t.Errorf("Accepts again: %v, %d more probes, want none", err, f.infos.Load()-asked)
	}
	if n := f.installs.Load(); n != 1 {
		t.Fatalf("%d installs before the switch, want 1", n)
	}
	e.iss.SetCA(next)
	if err := e.pool.Reissue(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !chainsTo(e.ctrl.Current().Leaf, next) {
		t.Error("the controller's certificate is not of the CA that signs")
	}
	eventually(t, "the agent enrolled under the next CA", func() bool {
		c := f.cert.Current()
		if c == nil || len(c.Certificate) == 0 {
			return false
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		return err == nil && chainsTo(leaf, next)
	})
	eventually(t, "a verified connection", func() bool { return e.lastErr(node) == nil })
	e.trust.Set(next.Cert) // the old CA dropped
	if err := e.capabilities(node); err != nil {
		t.Fatalf("a call after the old CA was dropped: %v", err)
	}
	// The metric follows the connection made with the agent's newest
	// certificate; an enrollment may still be landing.
	eventually(t, "the node's certificate expiry metric at its current certificate's", func() bool {
		leaf, err := x509.ParseCertificate(f.cert.Current().Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return testutil.ToFloat64(e.pool.certExpiry.WithLabelValues(roleNode, node)) == float64(leaf.NotAfter.Unix())
	})
}
