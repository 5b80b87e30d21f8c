package nodeca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// DefaultCAValidity makes rotation a planned event; a lost key does not live forever.
const DefaultCAValidity = 365 * 24 * time.Hour

// ClockSkew backdates NotBefore so a node whose clock lags accepts a fresh certificate.
const ClockSkew = 5 * time.Minute

// CA is a certificate authority: its self-signed certificate and its key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// CAOptions configures NewCA.
type CAOptions struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Validity is how long the CA is valid; 0 means DefaultCAValidity.
	Validity time.Duration
}

// NewCA generates an ECDSA P-256 CA that signs leaves only (path length 0).
func NewCA(opts CAOptions) (*CA, error) {
	now := clock(opts.Now)()
	validity := opts.Validity
	if validity == 0 {
		validity = DefaultCAValidity
	}
	if validity < 0 {
		return nil, fmt.Errorf("CA validity %s: must be positive", validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "carve node channel CA"},
		NotBefore:             now.Add(-ClockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// MarshalPEM encodes the certificate and PKCS #8 key as PEM.
func (ca *CA) MarshalPEM() (certPEM, keyPEM []byte, err error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal CA key: %w", err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	return certPEM, keyPEM, nil
}

// ParseCA decodes MarshalPEM's output, refusing a non-CA or a mismatched key.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parsePEM(certPEM, "CERTIFICATE", x509.ParseCertificate)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("CA certificate: not a CA (basic constraints or cert-sign usage missing)")
	}
	parsed, err := parsePEM(keyPEM, "PRIVATE KEY", x509.ParsePKCS8PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key: %T cannot sign", parsed)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, errors.New("CA key: does not match the CA certificate")
	}
	return &CA{Cert: cert, Key: key}, nil
}

// parsePEM parses with parse the one PEM block of data, of type typ.
func parsePEM[T any](data []byte, typ string, parse func([]byte) (T, error)) (T, error) {
	var none T
	block, rest := pem.Decode(data)
	if block == nil {
		return none, fmt.Errorf("no PEM block (want %q)", typ)
	}
	if block.Type != typ {
		return none, fmt.Errorf("PEM block %q, want %q", block.Type, typ)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return none, fmt.Errorf("trailing data after the %q PEM block", typ)
	}
	return parse(block.Bytes)
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return serial, nil
}

func clock(now func() time.Time) func() time.Time {
	if now == nil {
		return time.Now
	}
	return now
}
