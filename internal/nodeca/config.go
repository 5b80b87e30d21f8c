package nodeca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// Peer is one end of the node channel: its certificate and trusted CAs, both changeable.
type Peer struct {
	Cert *Keypair
	CAs  *Pool
	// Now is the clock certificates are checked against; nil means time.Now.
	Now func() time.Time
}

func (p Peer) check() error {
	if p.Cert == nil || p.CAs == nil {
		return errors.New("node channel TLS: a certificate and a CA pool are required")
	}
	return nil
}

// ServerConfig is the node agent's listener: TLS 1.3, a client certificate naming the
// controller and nothing else; no session tickets, so every handshake is checked anew.
func ServerConfig(p Peer) (*tls.Config, error) {
	return listenerConfig(p, x509.ExtKeyUsageClientAuth, identity(ControllerURI))
}

func listenerConfig(p Peer, usage x509.ExtKeyUsage, wantOf func(*x509.Certificate) (string, error)) (*tls.Config, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	now := clock(p.Now)
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		GetCertificate:         p.Cert.GetCertificate,
		ClientAuth:             tls.RequireAnyClientCert, // verified below against the current pool
		SessionTicketsDisabled: true,
		Time:                   p.Now,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs, p.CAs, now, usage, wantOf)
		},
	}, nil
}

// ClientConfig is the controller dialing node: only a certificate naming exactly that
// node is accepted. Build one per node.
func ClientConfig(p Peer, node string) (*tls.Config, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	want, err := NodeURI(node)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: p.Cert.GetClientCertificate,
		// VerifyConnection checks the chain against the current pool and the node's identity.
		InsecureSkipVerify: true, //nolint:gosec // G402: the chain and identity are verified in VerifyConnection.
		Time:               p.Now,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs, p.CAs, clock(p.Now), x509.ExtKeyUsageServerAuth, identity(want))
		},
	}, nil
}

// verifyPeer checks the peer's chain for usage and its only URI SAN against wantOf.
func verifyPeer(cs tls.ConnectionState, pool *Pool, now func() time.Time, usage x509.ExtKeyUsage, wantOf func(*x509.Certificate) (string, error)) error {
	if len(cs.PeerCertificates) == 0 {
		want, _ := wantOf(nil)
		return fmt.Errorf("peer presented no certificate (want %s)", want)
	}
	leaf := cs.PeerCertificates[0]
	want, err := wantOf(leaf)
	if err != nil {
		return fmt.Errorf("peer %w", err)
	}
	if err := verifyLeaf(leaf, cs.PeerCertificates[1:], pool, now(), usage, want); err != nil {
		return fmt.Errorf("peer %w", err)
	}
	return nil
}

func identity(want string) func(*x509.Certificate) (string, error) {
	return func(*x509.Certificate) (string, error) { return want, nil }
}

// VerifyNodeCertificate checks cert as ClientConfig would for node.
func VerifyNodeCertificate(cert *x509.Certificate, pool *Pool, now time.Time, node string) error {
	want, err := NodeURI(node)
	if err != nil {
		return err
	}
	return verifyLeaf(cert, nil, pool, now, x509.ExtKeyUsageServerAuth, want)
}

func verifyLeaf(leaf *x509.Certificate, inter []*x509.Certificate, pool *Pool, now time.Time, usage x509.ExtKeyUsage, want string) error {
	var roots *x509.CertPool
	if pool != nil {
		roots = pool.CertPool()
	}
	if roots == nil {
		// A nil pool would mean the system roots: never trust those here.
		return errors.New("certificate: no trusted CA for the node channel")
	}
	inters := x509.NewCertPool()
	for _, c := range inter {
		inters.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inters,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	}); err != nil {
		return fmt.Errorf("certificate (want %s): %w", want, err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		return fmt.Errorf("identity %v, want exactly %s", leaf.URIs, want)
	}
	return nil
}
