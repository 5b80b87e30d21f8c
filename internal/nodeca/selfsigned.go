package nodeca

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"
)

// selfSignedValidity only has to outlast enrollment: nothing trusts it.
const selfSignedValidity = 365 * 24 * time.Hour

// SelfSigned is the certificate an agent presents until enrolled; it chains to no CA,
// so only the enrollment connection, which checks the token instead, accepts it.
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
