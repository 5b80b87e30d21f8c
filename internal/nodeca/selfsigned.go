package nodeca

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"
)

// selfSignedValidity is how long a node agent's bootstrap certificate is
// valid. Nothing trusts it (the controller does not verify the node on the
// one connection where it is presented), so its life only has to outlast
// the agent's wait for enrollment.
const selfSignedValidity = 365 * 24 * time.Hour

// SelfSigned returns a self-signed server certificate for key naming node:
// what a node agent presents until the controller has signed its key
// (Issuer.SignNodeCSR). It chains to no CA, so a controller verifying
// with ClientConfig refuses it; only the enrollment connection, which
// checks the node through its token instead, accepts it.
func SelfSigned(key crypto.Signer, node string) (*tls.Certificate, error) {
	uri, err := NodeURI(node)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl, err := leafTemplate(node+" (not enrolled)", uri, x509.ExtKeyUsageServerAuth, now, now.Add(selfSignedValidity))
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate for %s: %w", uri, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse self-signed certificate for %s: %w", uri, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
