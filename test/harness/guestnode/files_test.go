package guestnode

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/test/harness/guestvm"
)

// TestKubeletServingCertificate: the kubelet is given its serving
// certificate and key from the host, as a pair, for the node's name and
// IP, so it never writes its own to the system disk.
func TestKubeletServingCertificate(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"kubelet", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := New(Spec{Name: "real-1", NodeIP: "10.0.2.101", WorkDir: dir, Kubelet: filepath.Join(dir, "kubelet"),
		CACert: filepath.Join(dir, "ca.crt"), Token: "t", DataDiskSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	files, err := n.files()
	if err != nil {
		t.Fatal(err)
	}
	data := map[string]guestvm.File{}
	for _, f := range files {
		data[guestvm.GuestPath(f.Name)] = f
	}
	var cfg struct {
		TLSCertFile       string `json:"tlsCertFile"`
		TLSPrivateKeyFile string `json:"tlsPrivateKeyFile"`
	}
	if err := yaml.Unmarshal(data[guestvm.GuestPath("config/kubelet.yaml")].Data, &cfg); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := data[cfg.TLSCertFile], data[cfg.TLSPrivateKeyFile]
	if certFile.Data == nil || keyFile.Data == nil {
		t.Fatalf("kubelet.yaml names %q and %q; the guest gets neither or only one of them", cfg.TLSCertFile, cfg.TLSPrivateKeyFile)
	}
	if keyFile.Mode != 0o600 {
		t.Errorf("the key's mode is %v, want 0600", keyFile.Mode)
	}
	pair, err := tls.X509KeyPair(certFile.Data, keyFile.Data)
	if err != nil {
		t.Fatalf("certificate and key are no pair: %v", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("10.0.2.101"); err != nil {
		t.Error(err)
	}
	if err := cert.VerifyHostname("real-1"); err != nil {
		t.Error(err)
	}
}
