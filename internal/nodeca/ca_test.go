package nodeca

import (
	"bytes"
	"encoding/pem"
	"strings"
	"testing"
	"time"
)

// base is the fixed time every test's clocks start from.
var base = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

func fixed(t time.Time) func() time.Time { return func() time.Time { return t } }

func mustCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA(CAOptions{Now: fixed(base.Add(-48 * time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestNewCA(t *testing.T) {
	ca := mustCA(t)
	c := ca.Cert
	if !c.IsCA || !c.MaxPathLenZero || c.MaxPathLen != 0 {
		t.Errorf("CA constraints: IsCA=%v MaxPathLen=%d zero=%v", c.IsCA, c.MaxPathLen, c.MaxPathLenZero)
	}
	start := base.Add(-48 * time.Hour)
	if got, want := c.NotAfter, start.Add(DefaultCAValidity); !got.Equal(want) {
		t.Errorf("NotAfter = %s, want %s", got, want)
	}
	if !c.NotBefore.Before(start) {
		t.Errorf("NotBefore %s not backdated before %s", c.NotBefore, start)
	}
	if _, err := NewCA(CAOptions{Validity: -time.Hour}); err == nil {
		t.Error("negative validity accepted")
	}
}

func TestCAPEMRoundTrip(t *testing.T) {
	ca := mustCA(t)
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(ca.Cert) {
		t.Error("certificate changed in the round trip")
	}
	// The parsed CA must still sign: a leaf from it verifies against the original.
	iss, err := NewIssuer(got, IssuerOptions{Now: fixed(base)})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := iss.IssueNode("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.Leaf.CheckSignatureFrom(ca.Cert); err != nil {
		t.Errorf("leaf from the parsed CA: %v", err)
	}
}

func TestParseCARefuses(t *testing.T) {
	ca, other := mustCA(t), mustCA(t)
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := other.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	iss, err := NewIssuer(ca, IssuerOptions{Now: fixed(base)})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := iss.IssueController()
	if err != nil {
		t.Fatal(err)
	}
	leafPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]})

	tests := []struct {
		name          string
		cert, key     []byte
		wantErrSubstr string
	}{
		{"empty certificate", nil, keyPEM, "CA certificate: no PEM block"},
		{"key in the certificate field", keyPEM, keyPEM, `PEM block "PRIVATE KEY", want "CERTIFICATE"`},
		{"trailing data", append(bytes.Clone(certPEM), certPEM...), keyPEM, "trailing data"},
		{"leaf, not a CA", leafPEM, keyPEM, "not a CA"},
		{"another CA's key", certPEM, otherKey, "does not match"},
		{"garbage key", certPEM, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), "CA key:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCA(tt.cert, tt.key)
			if err == nil || !strings.Contains(err.Error(), tt.wantErrSubstr) {
				t.Errorf("ParseCA error = %v, want one containing %q", err, tt.wantErrSubstr)
			}
		})
	}
}
