package plugintest

import (
	"crypto/tls"
	"testing"

	"github.com/carve-csi/carve/internal/nodeca"
)

// MustDevicePath is DevicePath for a test: a volume ID that names no
// device fails t.
func MustDevicePath(t testing.TB, volumeID string) string {
	t.Helper()
	dev, err := DevicePath(volumeID)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// NewControllerIssuer is a new node-channel CA, its issuer, and a
// controller certificate the issuer made; a failure fails t.
func NewControllerIssuer(t testing.TB) (*nodeca.CA, *nodeca.Issuer, *tls.Certificate) {
	t.Helper()
	ca, err := nodeca.NewCA(nodeca.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := nodeca.NewIssuer(ca, nodeca.IssuerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := iss.IssueController()
	if err != nil {
		t.Fatal(err)
	}
	return ca, iss, ctrl
}
