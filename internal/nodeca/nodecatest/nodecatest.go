// Package nodecatest makes node-channel CAs and certificates for tests;
// a failure fails the test.
package nodecatest

import (
	"crypto/tls"
	"testing"

	"github.com/carve-csi/carve/internal/nodeca"
)

// NewIssuer is a new CA and its issuer, both with the default options.
func NewIssuer(t testing.TB) (*nodeca.CA, *nodeca.Issuer) {
	t.Helper()
	ca, err := nodeca.NewCA(nodeca.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := nodeca.NewIssuer(ca, nodeca.IssuerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ca, iss
}

// NewControllerIssuer is NewIssuer and a controller certificate the
// issuer made.
func NewControllerIssuer(t testing.TB) (*nodeca.CA, *nodeca.Issuer, *tls.Certificate) {
	t.Helper()
	ca, iss := NewIssuer(t)
	ctrl, err := iss.IssueController()
	if err != nil {
		t.Fatal(err)
	}
	return ca, iss, ctrl
}
