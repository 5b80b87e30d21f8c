package nodeca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestValidateNodeName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"node-a", true},
		{"worker-1.example.com", true},
		{"a", true},
		{"0", true},
		{strings.Repeat("a", 63) + "." + strings.Repeat("b", 63), true},
		{strings.Repeat("a.", 126) + "a", true}, // 253 characters
		{strings.Repeat("a.", 126) + "ab", false},
		{"", false},
		{"Node-A", false},
		{"-node", false},
		{"node-", false},
		{"node_a", false},
		{"node/a", false},
		{"node..a", false},
		{".node", false},
		{"node a", false},
		{"node-a/../node-b", false},
		{"nöde", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateNodeName(tt.name)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidateNodeName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
			}
			// The restated rule must agree with Kubernetes' own.
			if k8sOK := len(validation.IsDNS1123Subdomain(tt.name)) == 0; k8sOK != tt.ok {
				t.Errorf("apimachinery says ok=%v for %q", k8sOK, tt.name)
			}
			if err != nil && (!strings.Contains(err.Error(), "node name") || !strings.Contains(err.Error(), "DNS-1123 subdomain")) {
				t.Errorf("error %q names neither the field nor the allowed form", err)
			}
		})
	}
}

func TestIssueValidityAndIdentity(t *testing.T) {
	ca := mustCA(t)
	tests := []struct {
		name     string
		opts     IssuerOptions
		issue    func(*Issuer) (*x509.Certificate, error)
		wantURI  string
		wantLife time.Duration
		wantEKU  x509.ExtKeyUsage
	}{
		{
			name:     "node, default validity",
			issue:    issueNode("worker-1.example"),
			wantURI:  "carve://node/worker-1.example",
			wantLife: 24 * time.Hour,
			wantEKU:  x509.ExtKeyUsageServerAuth,
		},
		{
			name:     "node, configured validity",
			opts:     IssuerOptions{NodeValidity: 2 * time.Hour, ControllerValidity: time.Hour},
			issue:    issueNode("node-a"),
			wantURI:  "carve://node/node-a",
			wantLife: 2 * time.Hour,
			wantEKU:  x509.ExtKeyUsageServerAuth,
		},
		{
			name:     "controller, configured validity",
			opts:     IssuerOptions{NodeValidity: 2 * time.Hour, ControllerValidity: time.Hour},
			issue:    issueController,
			wantURI:  ControllerURI,
			wantLife: time.Hour,
			wantEKU:  x509.ExtKeyUsageClientAuth,
		},
		{
			name:     "never outlives the CA",
			opts:     IssuerOptions{NodeValidity: 10 * DefaultCAValidity},
			issue:    issueNode("node-a"),
			wantURI:  "carve://node/node-a",
			wantLife: ca.Cert.NotAfter.Sub(base),
			wantEKU:  x509.ExtKeyUsageServerAuth,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Now = fixed(base)
			iss, err := NewIssuer(ca, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			c, err := tt.issue(iss)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.URIs) != 1 || c.URIs[0].String() != tt.wantURI {
				t.Errorf("URIs = %v, want [%s]", c.URIs, tt.wantURI)
			}
			if len(c.DNSNames)+len(c.IPAddresses)+len(c.EmailAddresses) != 0 {
				t.Errorf("other SANs present: %v %v %v", c.DNSNames, c.IPAddresses, c.EmailAddresses)
			}
			if got := c.NotAfter.Sub(base); got != tt.wantLife {
				t.Errorf("valid for %s after issue, want %s", got, tt.wantLife)
			}
			if c.NotBefore.After(base) {
				t.Errorf("NotBefore %s after the issue time", c.NotBefore)
			}
			if len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != tt.wantEKU {
				t.Errorf("ExtKeyUsage = %v, want [%v]", c.ExtKeyUsage, tt.wantEKU)
			}
			if c.IsCA {
				t.Error("leaf is a CA")
			}
			if err := c.CheckSignatureFrom(ca.Cert); err != nil {
				t.Error(err)
			}
		})
	}
}

func issueNode(name string) func(*Issuer) (*x509.Certificate, error) {
	return func(iss *Issuer) (*x509.Certificate, error) {
		c, err := iss.IssueNode(name)
		if err != nil {
			return nil, err
		}
		return c.Leaf, nil
	}
}

func issueController(iss *Issuer) (*x509.Certificate, error) {
	c, err := iss.IssueController()
	if err != nil {
		return nil, err
	}
	return c.Leaf, nil
}

func TestIssueNodeRefusesBadNames(t *testing.T) {
	iss, err := NewIssuer(mustCA(t), IssuerOptions{Now: fixed(base)})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "Node-A", "node/../other", "carve://controller"} {
		if _, err := iss.IssueNode(name); err == nil || !strings.Contains(err.Error(), "DNS-1123") {
			t.Errorf("IssueNode(%q) = %v, want a DNS-1123 error", name, err)
		}
	}
}

func TestNewIssuerRefuses(t *testing.T) {
	if _, err := NewIssuer(nil, IssuerOptions{}); err == nil {
		t.Error("nil CA accepted")
	}
	if _, err := NewIssuer(mustCA(t), IssuerOptions{NodeValidity: -time.Second}); err == nil {
		t.Error("negative validity accepted")
	}
}

func TestSignNodeCSR(t *testing.T) {
	ca := mustCA(t)
	iss, err := NewIssuer(ca, IssuerOptions{Now: fixed(base)})
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// The request claims another node and the controller: both are ignored.
	claimed := []*url.URL{{Scheme: "carve", Host: "node", Path: "/node-b"}, {Scheme: "carve", Host: "controller"}}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "node-b"},
		DNSNames: []string{"node-b"},
		URIs:     claimed,
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	der, err := iss.SignNodeCSR("node-a", csr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "carve://node/node-a" || len(c.DNSNames) != 0 {
		t.Errorf("identity URIs=%v DNS=%v, want only carve://node/node-a", c.URIs, c.DNSNames)
	}
	if !key.PublicKey.Equal(c.PublicKey) {
		t.Error("certificate is not for the request's key")
	}

	tampered := append([]byte(nil), csr...)
	tampered[len(tampered)-1] ^= 0xff
	tests := []struct {
		name, node string
		csr        []byte
	}{
		{"bad node name", "Node_A", csr},
		{"garbage request", "node-a", []byte("not DER")},
		{"bad signature", "node-a", tampered},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := iss.SignNodeCSR(tt.node, tt.csr); err == nil {
				t.Error("signed")
			}
		})
	}
}
