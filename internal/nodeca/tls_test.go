package nodeca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
)

// server is a node agent's listener on loopback: it handshakes every
// connection with one tls.Config (never rebuilt, never restarted), writes
// "ok" on success, and reports each handshake's error.
type server struct {
	addr string
	errs chan error
}

func startServer(t *testing.T, cfg *tls.Config) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	s := &server{addr: ln.Addr().String(), errs: make(chan error, 16)}
	ctx := t.Context()
	go func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
			conn := tls.Server(raw, cfg)
			err = conn.HandshakeContext(ctx)
			if err == nil {
				_, err = conn.Write([]byte("ok"))
			}
			_ = conn.Close()
			s.errs <- err
		}
	}()
	return s
}

// dial connects as cfg, and returns the serial of the server's certificate
// (nil if none was seen), the client's error and the server's.
func (s *server) dial(t *testing.T, cfg *tls.Config) (serial *big.Int, clientErr, serverErr error) {
	t.Helper()
	var d net.Dialer
	raw, err := d.DialContext(t.Context(), "tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	conn := tls.Client(raw, cfg)
	clientErr = conn.HandshakeContext(t.Context())
	if clientErr == nil {
		// In TLS 1.3 the server checks the client's certificate after the
		// client has finished: its refusal shows on the first read.
		buf := make([]byte, 2)
		_, clientErr = io.ReadFull(conn, buf)
	}
	if pc := conn.ConnectionState().PeerCertificates; len(pc) > 0 {
		serial = pc[0].SerialNumber
	}
	_ = conn.Close()
	select {
	case serverErr = <-s.errs:
	case <-time.After(10 * time.Second):
		t.Fatal("server did not finish the handshake")
	}
	return serial, clientErr, serverErr
}

// env is a CA with an issuer, and a second CA nobody trusts.
type env struct {
	ca, other     *CA
	iss, otherIss *Issuer
	// expired issues certificates that have expired by now (base+1h).
	expired *Issuer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{ca: mustCA(t), other: mustCA(t)}
	var err error
	if e.iss, err = NewIssuer(e.ca, IssuerOptions{Now: fixed(base)}); err != nil {
		t.Fatal(err)
	}
	if e.otherIss, err = NewIssuer(e.other, IssuerOptions{Now: fixed(base)}); err != nil {
		t.Fatal(err)
	}
	if e.expired, err = NewIssuer(e.ca, IssuerOptions{Now: fixed(base.Add(-25 * time.Hour))}); err != nil {
		t.Fatal(err)
	}
	return e
}

func mustNode(t *testing.T, iss *Issuer, node string) *tls.Certificate {
	t.Helper()
	c, err := iss.IssueNode(node)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustCtrl(t *testing.T, iss *Issuer) *tls.Certificate {
	t.Helper()
	c, err := iss.IssueController()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func serverConfig(t *testing.T, cert *tls.Certificate, cas *Pool, now time.Time) *tls.Config {
	t.Helper()
	cfg, err := ServerConfig(Peer{Cert: NewKeypair(cert), CAs: cas, Now: fixed(now)})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func clientConfig(t *testing.T, cert *tls.Certificate, cas *Pool, now time.Time, node string) *tls.Config {
	t.Helper()
	cfg, err := ClientConfig(Peer{Cert: NewKeypair(cert), CAs: cas, Now: fixed(now)}, node)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestHandshake(t *testing.T) {
	e := newEnv(t)
	now := base.Add(time.Hour)
	nodeA := mustNode(t, e.iss, "node-a")
	nodeB := mustNode(t, e.iss, "node-b")
	ctrl := mustCtrl(t, e.iss)
	// A certificate for client use that names a node: only the identity
	// check can refuse it (a node certificate is already refused as a
	// client by its key usage).
	nodeAsClient, err := e.iss.issue("node-b", "carve://node/node-b", x509.ExtKeyUsageClientAuth, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := NewPool(e.ca.Cert)

	plainClient := func(maxVersion uint16, cert *tls.Certificate) *tls.Config {
		cfg := &tls.Config{MaxVersion: maxVersion, InsecureSkipVerify: true}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		return cfg
	}

	tests := []struct {
		name   string
		server *tls.Config
		client *tls.Config
		// wantServerErr / wantClientErr: a substring of the side that
		// refuses; both empty means the handshake succeeds.
		wantServerErr, wantClientErr string
	}{
		{
			name:   "controller to the right node",
			server: serverConfig(t, nodeA, pool, now),
			client: clientConfig(t, ctrl, pool, now, "node-a"),
		},
		{
			name:          "node presents another node's identity",
			server:        serverConfig(t, nodeB, pool, now),
			client:        clientConfig(t, ctrl, pool, now, "node-a"),
			wantClientErr: "want exactly carve://node/node-a",
		},
		{
			name:          "node certificate from another CA",
			server:        serverConfig(t, mustNode(t, e.otherIss, "node-a"), pool, now),
			client:        clientConfig(t, ctrl, pool, now, "node-a"),
			wantClientErr: "unknown authority",
		},
		{
			name:          "client certificate from another CA",
			server:        serverConfig(t, nodeA, pool, now),
			client:        clientConfig(t, mustCtrl(t, e.otherIss), NewPool(e.ca.Cert), now, "node-a"),
			wantServerErr: "unknown authority",
		},
		{
			name:          "client is a node certificate",
			server:        serverConfig(t, nodeA, pool, now),
			client:        clientConfig(t, nodeB, pool, now, "node-a"),
			wantServerErr: "incompatible key usage",
		},
		{
			name:          "client certificate names a node, not the controller",
			server:        serverConfig(t, nodeA, pool, now),
			client:        clientConfig(t, nodeAsClient, pool, now, "node-a"),
			wantServerErr: "want exactly carve://controller",
		},
		{
			name:          "no client certificate",
			server:        serverConfig(t, nodeA, pool, now),
			client:        plainClient(0, nil),
			wantServerErr: "didn't provide a certificate",
		},
		{
			name:          "TLS 1.2 client",
			server:        serverConfig(t, nodeA, pool, now),
			client:        plainClient(tls.VersionTLS12, ctrl),
			wantServerErr: "unsupported versions",
		},
		{
			name:          "expired node certificate",
			server:        serverConfig(t, mustNode(t, e.expired, "node-a"), pool, now),
			client:        clientConfig(t, ctrl, pool, now, "node-a"),
			wantClientErr: "expired",
		},
		{
			name:          "expired controller certificate",
			server:        serverConfig(t, nodeA, pool, now),
			client:        clientConfig(t, mustCtrl(t, e.expired), pool, now, "node-a"),
			wantServerErr: "expired",
		},
		{
			name:          "node's clock past the controller certificate",
			server:        serverConfig(t, nodeA, pool, base.Add(25*time.Hour)),
			client:        clientConfig(t, ctrl, pool, now, "node-a"),
			wantServerErr: "expired",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, clientErr, serverErr := startServer(t, tt.server).dial(t, tt.client)
			if tt.wantServerErr == "" && tt.wantClientErr == "" {
				if clientErr != nil || serverErr != nil {
					t.Fatalf("client error %v, server error %v; want success", clientErr, serverErr)
				}
				return
			}
			// Whoever refuses, neither side gets a working connection.
			if clientErr == nil || serverErr == nil {
				t.Fatalf("client error %v, server error %v; want both to fail", clientErr, serverErr)
			}
			for _, c := range []struct {
				side string
				err  error
				want string
			}{{"server", serverErr, tt.wantServerErr}, {"client", clientErr, tt.wantClientErr}} {
				if c.want != "" && !strings.Contains(c.err.Error(), c.want) {
					t.Errorf("%s error %q, want it to contain %q", c.side, c.err, c.want)
				}
			}
		})
	}
}

func TestRotateNodeCertificate(t *testing.T) {
	e := newEnv(t)
	now := base.Add(time.Hour)
	pool := NewPool(e.ca.Cert)
	first := mustNode(t, e.iss, "node-a")
	kp := NewKeypair(first)
	cfg, err := ServerConfig(Peer{Cert: kp, CAs: pool, Now: fixed(now)})
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, cfg)
	client := clientConfig(t, mustCtrl(t, e.iss), pool, now, "node-a")

	second := mustNode(t, e.iss, "node-a")
	for i, want := range []*tls.Certificate{first, second} {
		kp.Set(want)
		serial, clientErr, serverErr := srv.dial(t, client)
		if clientErr != nil || serverErr != nil {
			t.Fatalf("handshake %d: client %v, server %v", i, clientErr, serverErr)
		}
		if serial.Cmp(want.Leaf.SerialNumber) != 0 {
			t.Errorf("handshake %d saw serial %x, want %x", i, serial, want.Leaf.SerialNumber)
		}
	}
	if first.Leaf.SerialNumber.Cmp(second.Leaf.SerialNumber) == 0 {
		t.Error("the two certificates share a serial")
	}
}

// TestRotateCA walks a CA rotation on one running server: trust both CAs,
// reissue every leaf from the new one, drop the old one.
func TestRotateCA(t *testing.T) {
	e := newEnv(t)
	now := base.Add(time.Hour)
	oldCA, newCA := e.ca, e.other
	oldIss, newIss := e.iss, e.otherIss

	nodeCert, ctrlCert := NewKeypair(mustNode(t, oldIss, "node-a")), NewKeypair(mustCtrl(t, oldIss))
	nodePool, ctrlPool := NewPool(oldCA.Cert), NewPool(oldCA.Cert)
	srvCfg, err := ServerConfig(Peer{Cert: nodeCert, CAs: nodePool, Now: fixed(now)})
	if err != nil {
		t.Fatal(err)
	}
	cliCfg, err := ClientConfig(Peer{Cert: ctrlCert, CAs: ctrlPool, Now: fixed(now)}, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, srvCfg)

	steps := []struct {
		name   string
		change func()
		wantOK bool
	}{
		{"old CA everywhere", func() {}, true},
		{"node reissued by the new CA before it is trusted", func() {
			nodeCert.Set(mustNode(t, newIss, "node-a"))
		}, false},
		{"both CAs trusted", func() {
			nodePool.Set(oldCA.Cert, newCA.Cert)
			ctrlPool.Set(oldCA.Cert, newCA.Cert)
		}, true},
		{"controller reissued by the new CA", func() {
			ctrlCert.Set(mustCtrl(t, newIss))
		}, true},
		{"old CA dropped", func() {
			nodePool.Set(newCA.Cert)
			ctrlPool.Set(newCA.Cert)
		}, true},
		{"a leftover old-CA controller certificate", func() {
			ctrlCert.Set(mustCtrl(t, oldIss))
		}, false},
	}
	for _, st := range steps {
		st.change()
		_, clientErr, serverErr := srv.dial(t, cliCfg)
		if ok := clientErr == nil && serverErr == nil; ok != st.wantOK {
			t.Errorf("%s: client %v, server %v; want ok=%v", st.name, clientErr, serverErr, st.wantOK)
		}
	}
}

// TestPlaintextClient: a gRPC client without TLS (its HTTP/2 preface) gets
// nothing back that HTTP/2 could read.
func TestPlaintextClient(t *testing.T) {
	e := newEnv(t)
	now := base.Add(time.Hour)
	srv := startServer(t, serverConfig(t, mustNode(t, e.iss, "node-a"), NewPool(e.ca.Cert), now))
	var d net.Dialer
	conn, err := d.DialContext(t.Context(), "tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("server kept the plaintext connection open")
	}
	// At most a TLS alert record (type 21), never an HTTP/2 frame.
	if len(got) > 0 && got[0] != 21 {
		t.Errorf("server answered plaintext with %q", got)
	}
	if serverErr := <-srv.errs; serverErr == nil {
		t.Error("server accepted a plaintext connection")
	}
}

func TestConfigsRefuse(t *testing.T) {
	e := newEnv(t)
	kp, pool := NewKeypair(mustCtrl(t, e.iss)), NewPool(e.ca.Cert)
	tests := []struct {
		name string
		err  func() error
	}{
		{"server without a certificate", func() error { _, err := ServerConfig(Peer{CAs: pool}); return err }},
		{"server without CAs", func() error { _, err := ServerConfig(Peer{Cert: kp}); return err }},
		{"client without CAs", func() error { _, err := ClientConfig(Peer{Cert: kp}, "node-a"); return err }},
		{"client for a bad node name", func() error { _, err := ClientConfig(Peer{Cert: kp, CAs: pool}, "Node_A"); return err }},
		{"empty keypair", func() error { _, err := (&Keypair{}).GetCertificate(nil); return err }},
		{"zero pool", func() error {
			return verifyPeer(tls.ConnectionState{PeerCertificates: []*x509.Certificate{kp.Current().Leaf}},
				&Pool{}, time.Now, x509.ExtKeyUsageClientAuth, identity(ControllerURI))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err() == nil {
				t.Error("accepted")
			}
		})
	}
}
