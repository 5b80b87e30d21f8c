package nodeca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync/atomic"
)

// Keypair holds this side's certificate, read at each handshake, so Set rotates it live.
type Keypair struct {
	cur atomic.Pointer[tls.Certificate]
}

// NewKeypair returns a Keypair holding cert.
func NewKeypair(cert *tls.Certificate) *Keypair {
	k := &Keypair{}
	k.Set(cert)
	return k
}

// Set replaces the certificate for the handshakes that follow.
func (k *Keypair) Set(cert *tls.Certificate) { k.cur.Store(cert) }

// Current returns the certificate new handshakes present.
func (k *Keypair) Current() *tls.Certificate { return k.cur.Load() }

// GetCertificate serves as tls.Config.GetCertificate.
func (k *Keypair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.get()
}

// GetClientCertificate serves as tls.Config.GetClientCertificate.
func (k *Keypair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.get()
}

func (k *Keypair) get() (*tls.Certificate, error) {
	cert := k.cur.Load()
	if cert == nil {
		return nil, errors.New("no certificate yet")
	}
	return cert, nil
}

// Pool holds the CAs a peer may chain to (old and new during a rotation).
type Pool struct {
	cur atomic.Pointer[x509.CertPool]
}

// NewPool returns a Pool trusting cas.
func NewPool(cas ...*x509.Certificate) *Pool {
	p := &Pool{}
	p.Set(cas...)
	return p
}

// Set replaces the trusted CAs; with none, no peer is trusted.
func (p *Pool) Set(cas ...*x509.Certificate) {
	if len(cas) == 0 {
		p.cur.Store(nil)
		return
	}
	pool := x509.NewCertPool()
	for _, ca := range cas {
		pool.AddCert(ca)
	}
	p.cur.Store(pool)
}

// CertPool returns the CAs trusted now; nil when there are none.
func (p *Pool) CertPool() *x509.CertPool { return p.cur.Load() }
