package channel

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/nodeca"
)

func TestEnrollToken(t *testing.T) {
	tests := []struct {
		name      string
		content   *string // nil: no file
		wantToken string
		wantCode  codes.Code
	}{
		{"as the kubelet writes it", ptr("eyJhbGciOi.claims.sig"), "eyJhbGciOi.claims.sig", codes.OK},
		{"a trailing newline", ptr("eyJ.claims.sig\n"), "eyJ.claims.sig", codes.OK},
		{"empty", ptr(""), "", codes.FailedPrecondition},
		{"white space only", ptr(" \n"), "", codes.FailedPrecondition},
		{"missing", nil, "", codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			e.agent.cfg.TokenFile = filepath.Join(t.TempDir(), "token")
			if tt.content != nil {
				if err := os.WriteFile(e.agent.cfg.TokenFile, []byte(*tt.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			resp, err := e.agent.Enroll(t.Context(), &nodeagentv1.EnrollRequest{})
			if status.Code(err) != tt.wantCode {
				t.Fatalf("Enroll: %v, want code %s", err, tt.wantCode)
			}
			if err != nil {
				return
			}
			if resp.GetToken() != tt.wantToken || resp.GetNodeName() != node {
				t.Errorf("token %q node %q, want %q %q", resp.GetToken(), resp.GetNodeName(), tt.wantToken, node)
			}
			der, err := e.iss.SignNodeCSR(node, resp.GetCsrDer())
			if err != nil {
				t.Fatalf("the issuer refused the request: %v", err)
			}
			cert, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			if !e.agent.key.PublicKey.Equal(cert.PublicKey) {
				t.Error("the request is not for the agent's key")
			}
		})
	}
}

// TestEnrollment runs the enrollment as the controller does, over the
// node channel: Enroll, sign, InstallCertificate; a certificate that is
// not for this node, this key or this CA is refused, and only once the
// right one is installed does a controller verifying the node connect.
func TestEnrollment(t *testing.T) {
	e := newEnv(t)
	addr := e.serve(t)
	ctrl := mustCtrl(t, e.iss)
	enrolling := dial(t, addr, credentials.NewTLS(enrollTLS(ctrl)))
	verified := func() error {
		cfg, err := nodeca.ClientConfig(nodeca.Peer{Cert: nodeca.NewKeypair(ctrl), CAs: e.trust}, node)
		if err != nil {
			t.Fatal(err)
		}
		// A new client each time: one connection per handshake.
		_, err = dial(t, addr, credentials.NewTLS(cfg)).Inventory(t.Context(), &nodeagentv1.InventoryRequest{})
		return err
	}
	if err := verified(); status.Code(err) != codes.Unavailable {
		t.Fatalf("a verifying controller reached a node not enrolled yet: %v", err)
	}

	resp, err := enrolling.Enroll(t.Context(), &nodeagentv1.EnrollRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetToken() != "eyJhbGciOi.token.sig" {
		t.Errorf("token %q", resp.GetToken())
	}
	csr := resp.GetCsrDer()
	sign := func(iss *nodeca.Issuer, n string) []byte {
		der, err := iss.SignNodeCSR(n, csr)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	expiredIss, err := nodeca.NewIssuer(e.ca, nodeca.IssuerOptions{Now: func() time.Time { return time.Now().Add(-48 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	otherKey, err := e.iss.IssueNode(node)
	if err != nil {
		t.Fatal(err)
	}
	refused := []struct {
		name string
		der  []byte
	}{
		{"another node's", sign(e.iss, "node-b")},
		{"another key's", otherKey.Leaf.Raw},
		{"another CA's", sign(e.otherIss, node)},
		{"expired", sign(expiredIss, node)},
		{"not a certificate", []byte("garbage")},
		{"none", nil},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			_, err := enrolling.InstallCertificate(t.Context(), &nodeagentv1.InstallCertificateRequest{CertificateDer: tt.der})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("InstallCertificate: %v, want InvalidArgument", err)
			}
			if err := verified(); status.Code(err) != codes.Unavailable {
				t.Errorf("after a refused certificate, a verifying controller connected: %v", err)
			}
		})
	}

	if _, err := enrolling.InstallCertificate(t.Context(), &nodeagentv1.InstallCertificateRequest{CertificateDer: sign(e.iss, node)}); err != nil {
		t.Fatalf("the node's certificate was refused: %v", err)
	}
	if err := verified(); err != nil {
		t.Fatalf("after enrollment, a verifying controller is refused: %v", err)
	}
	// The enrollment connection, opened before, still works: renewal
	// goes through it.
	if _, err := enrolling.Enroll(t.Context(), &nodeagentv1.EnrollRequest{}); err != nil {
		t.Errorf("Enroll again: %v", err)
	}
}

func ptr(s string) *string { return &s }
