package nodeca

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func certPEM(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

func TestParseBundle(t *testing.T) {
	e := newEnv(t)
	_, keyPEM, err := e.ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	leaf := mustNode(t, e.iss, "node-a").Leaf
	tests := []struct {
		name    string
		data    []byte
		want    int
		wantErr string
	}{
		{"one CA", certPEM(e.ca.Cert), 1, ""},
		{"two CAs during a rotation", certPEM(e.ca.Cert, e.other.Cert), 2, ""},
		{"surrounding blank lines", append(append([]byte("\n\n"), certPEM(e.ca.Cert)...), "\n\n"...), 1, ""},
		{"empty", nil, 0, "no certificate"},
		{"garbage", []byte("not a bundle"), 0, "not PEM"},
		{"garbage after a CA", append(certPEM(e.ca.Cert), "junk"...), 0, "not PEM"},
		{"a key", keyPEM, 0, `"PRIVATE KEY"`},
		{"a leaf", certPEM(e.ca.Cert, leaf), 0, "certificate 2 (CN=node-a) is not a CA"},
		{"a damaged certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}), 0, "certificate 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cas, err := ParseBundle(tt.data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || len(cas) != tt.want {
				t.Fatalf("%d CAs, err %v; want %d", len(cas), err, tt.want)
			}
		})
	}
}

// TestBundleFile follows the file through the life of a kubelet-mounted
// ConfigMap: absent at start, written, rotated by swapping the ..data
// symlink, damaged, removed; the pool trusts what it should at each step.
func TestBundleFile(t *testing.T) {
	e := newEnv(t)
	now := base.Add(time.Hour)
	nodeA := mustNode(t, e.iss, "node-a").Leaf
	nodeB := mustNode(t, e.otherIss, "node-b").Leaf
	dir := t.TempDir()
	path := filepath.Join(dir, "ca.crt")
	gen := 0
	// publish writes data as the kubelet does: a new timestamped
	// directory, then an atomic swap of the ..data symlink that ca.crt
	// points through.
	publish := func(data []byte) {
		gen++
		ts := filepath.Join(dir, "..gen"+strings.Repeat("x", gen))
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "ca.crt"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(path); err != nil {
			if err := os.Symlink(filepath.Join("..data", "ca.crt"), path); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := NewBundleFile(path)
	trusts := func(leaf *x509.Certificate, node string) bool {
		return VerifyNodeCertificate(leaf, b.Pool(), now, node) == nil
	}
	steps := []struct {
		name           string
		act            func()
		wantErr        string
		trustA, trustB bool
	}{
		{"absent at start", func() {}, "no such file", false, false},
		{"written", func() { publish(certPEM(e.ca.Cert)) }, "", true, false},
		{"unchanged", func() {}, "", true, false},
		{"rotation: both CAs", func() { publish(certPEM(e.ca.Cert, e.other.Cert)) }, "", true, true},
		{"rotation: the new CA only, same size", func() { publish(certPEM(e.other.Cert, e.other.Cert)) }, "", false, true},
		{"damaged: the last valid bundle stays", func() { publish([]byte("garbage")) }, "not PEM", false, true},
		{"removed: the last valid bundle stays", func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, "no such file", false, true},
		{"back", func() {
			if err := os.Symlink(filepath.Join("..data", "ca.crt"), path); err != nil {
				t.Fatal(err)
			}
			publish(certPEM(e.ca.Cert))
		}, "", true, false},
	}
	for _, s := range steps {
		s.act()
		err := b.Load()
		if s.wantErr == "" && err != nil || s.wantErr != "" && (err == nil || !strings.Contains(err.Error(), s.wantErr)) {
			t.Errorf("%s: Load: %v, want error containing %q", s.name, err, s.wantErr)
		}
		if got := trusts(nodeA, "node-a"); got != s.trustA {
			t.Errorf("%s: trusts the first CA: %v, want %v", s.name, got, s.trustA)
		}
		if got := trusts(nodeB, "node-b"); got != s.trustB {
			t.Errorf("%s: trusts the second CA: %v, want %v", s.name, got, s.trustB)
		}
	}
}

// TestBundleFileRun: Run picks up a bundle written after it started.
func TestBundleFileRun(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "ca.crt")
	b := NewBundleFile(path)
	go b.Run(t.Context(), 10*time.Millisecond)
	if err := os.WriteFile(path, certPEM(e.ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.Pool().CertPool() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the bundle written after Run started was never trusted")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
