package nodeca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestSelfSigned(t *testing.T) {
	e := newEnv(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c, err := SelfSigned(key, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Leaf.URIs; len(got) != 1 || got[0].String() != "carve://node/node-a" {
		t.Errorf("identity %v, want carve://node/node-a", got)
	}
	if !key.PublicKey.Equal(c.Leaf.PublicKey) {
		t.Error("the certificate is not for the key")
	}
	if err := VerifyNodeCertificate(c.Leaf, NewPool(e.ca.Cert), time.Now(), "node-a"); err == nil {
		t.Error("a self-signed certificate verified against carve's CA")
	}
	if _, err := SelfSigned(key, "Node_A"); err == nil {
		t.Error("a bad node name was accepted")
	}
}

func TestVerifyNodeCertificate(t *testing.T) {
	e := newEnv(t)
	now := base.Add(time.Hour)
	pool := NewPool(e.ca.Cert)
	tests := []struct {
		name    string
		cert    *x509.Certificate
		pool    *Pool
		node    string
		wantErr string
	}{
		{"the node's", mustNode(t, e.iss, "node-a").Leaf, pool, "node-a", ""},
		{"another node's", mustNode(t, e.iss, "node-b").Leaf, pool, "node-a", "want exactly carve://node/node-a"},
		{"another CA's", mustNode(t, e.otherIss, "node-a").Leaf, pool, "node-a", "unknown authority"},
		{"expired", mustNode(t, e.expired, "node-a").Leaf, pool, "node-a", "expired"},
		{"the controller's", mustCtrl(t, e.iss).Leaf, pool, "node-a", "usage"},
		{"no CA trusted", mustNode(t, e.iss, "node-a").Leaf, NewPool(), "node-a", "no trusted CA"},
		{"no pool", mustNode(t, e.iss, "node-a").Leaf, nil, "node-a", "no trusted CA"},
		{"bad node name", mustNode(t, e.iss, "node-a").Leaf, pool, "Node_A", "DNS-1123"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifyNodeCertificate(tt.cert, tt.pool, now, tt.node)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("err %v, want containing %q", err, tt.wantErr)
			}
		})
	}
}
