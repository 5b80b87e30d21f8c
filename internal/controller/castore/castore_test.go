package castore

import (
	"context"
	"encoding/pem"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/carve-csi/carve/internal/nodeca"
)

const (
	ns   = "carve-system"
	name = "carve-node-channel-ca"
)

func newCA(t *testing.T, opts nodeca.CAOptions) *nodeca.CA {
	t.Helper()
	ca, err := nodeca.NewCA(opts)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func caSecret(t *testing.T, ca *nodeca.CA) *corev1.Secret {
	t.Helper()
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
}

func certPEM(ca *nodeca.CA) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}))
}

// writes counts the create and update calls the fake saw, by resource.
func writes(client *fake.Clientset) map[string]int {
	n := map[string]int{}
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v == "create" || v == "update" {
			n[v+" "+a.GetResource().Resource]++
		}
	}
	return n
}

func bundle(t *testing.T, client *fake.Clientset) string {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm.Data[BundleKey]
}

// start is a replica's Store.Start, returning the CA that signs.
func start(ctx context.Context, client *fake.Clientset, namespace, name string) (*nodeca.CA, error) {
	s, err := New(Config{Client: client, Namespace: namespace, Name: name})
	if err != nil {
		return nil, err
	}
	st, err := s.Start(ctx)
	return st.Active, err
}

func TestEnsureCreatesThenReuses(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	first, err := start(ctx, client, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Type != corev1.SecretTypeTLS || s.Labels["app.kubernetes.io/managed-by"] != "carve-controller" {
		t.Errorf("Secret type %q labels %v", s.Type, s.Labels)
	}
	if got := bundle(t, client); got != certPEM(first) {
		t.Errorf("ca.crt = %q, want the CA certificate", got)
	}
	if got, want := writes(client), map[string]int{"create secrets": 1, "create configmaps": 1}; !equalCounts(got, want) {
		t.Errorf("writes %v, want %v", got, want)
	}

	client.ClearActions()
	second, err := start(ctx, client, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if !second.Cert.Equal(first.Cert) {
		t.Error("second Ensure returned another CA")
	}
	if got := writes(client); len(got) != 0 {
		t.Errorf("second Ensure wrote %v, want nothing", got)
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestEnsureBundle(t *testing.T) {
	ca := newCA(t, nodeca.CAOptions{})
	other := newCA(t, nodeca.CAOptions{})
	tests := []struct {
		name       string
		existing   map[string]string // nil: no ConfigMap
		wantUpdate bool
	}{
		{name: "same certificate, other whitespace", existing: map[string]string{BundleKey: "\n" + certPEM(ca) + "\n\n"}},
		{name: "another CA", existing: map[string]string{BundleKey: certPEM(other)}, wantUpdate: true},
		{name: "the CA and a stale one", existing: map[string]string{BundleKey: certPEM(other) + certPEM(ca)}, wantUpdate: true},
		{name: "garbage", existing: map[string]string{BundleKey: "not a certificate"}, wantUpdate: true},
		{name: "no ca.crt, other keys kept", existing: map[string]string{"note": "kept"}, wantUpdate: true},
		{name: "no data", existing: map[string]string{}, wantUpdate: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			objs := []runtime.Object{caSecret(t, ca)}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: tt.existing}
			objs = append(objs, cm)
			client := fake.NewClientset(objs...)
			got, err := start(ctx, client, ns, name)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Cert.Equal(ca.Cert) {
				t.Error("Ensure returned another CA than the Secret's")
			}
			if n := writes(client)["update configmaps"]; (n == 1) != tt.wantUpdate || n > 1 {
				t.Errorf("ConfigMap updates: %d, want update %v", n, tt.wantUpdate)
			}
			if b := bundle(t, client); strings.TrimSpace(b) != strings.TrimSpace(certPEM(ca)) {
				t.Errorf("ca.crt = %q, want exactly the CA", b)
			}
			if tt.existing["note"] != "" {
				cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil || cm.Data["note"] != "kept" {
					t.Errorf("other keys of the ConfigMap lost: %v, %v", cm, err)
				}
			}
		})
	}
}

// TestEnsureRace: another replica creates the Secret between this one's
// Get and Create; this one must return that CA, not its own.
func TestEnsureRace(t *testing.T) {
	ctx := context.Background()
	winner := newCA(t, nodeca.CAOptions{})
	client := fake.NewClientset()
	client.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if err := client.Tracker().Add(caSecret(t, winner)); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewAlreadyExists(corev1.Resource("secrets"), name)
	})
	client.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{BundleKey: certPEM(winner)}}
		if err := client.Tracker().Add(cm); err != nil {
			t.Fatal(err)
		}
		return true, nil, apierrors.NewAlreadyExists(corev1.Resource("configmaps"), name)
	})
	got, err := start(ctx, client, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(winner.Cert) {
		t.Error("the losing replica returned its own CA")
	}
	if n := writes(client)["update configmaps"]; n != 0 {
		t.Errorf("ConfigMap updated %d times after losing the race to an equal one", n)
	}
}

// TestEnsureConcurrent runs replicas at once against one API.
func TestEnsureConcurrent(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	const n = 5
	cas := make([]*nodeca.CA, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { cas[i], errs[i] = start(ctx, client, ns, name) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		if !cas[i].Cert.Equal(cas[0].Cert) {
			t.Errorf("replica %d has another CA", i)
		}
	}
	if got := bundle(t, client); got != certPEM(cas[0]) {
		t.Error("ca.crt is not the CA every replica returned")
	}
}

func TestEnsureRefusesBadSecret(t *testing.T) {
	ca := newCA(t, nodeca.CAOptions{})
	other := newCA(t, nodeca.CAOptions{})
	tests := []struct {
		name    string
		mutate  func(*corev1.Secret)
		wantErr string
	}{
		{"corrupt certificate", func(s *corev1.Secret) { s.Data[corev1.TLSCertKey] = []byte("garbage") }, "CA certificate: no PEM block"},
		{"no key", func(s *corev1.Secret) { delete(s.Data, corev1.TLSPrivateKeyKey) }, "no tls.key"},
		{"another CA's key", func(s *corev1.Secret) {
			_, k, _ := other.MarshalPEM()
			s.Data[corev1.TLSPrivateKeyKey] = k
		}, "does not match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := caSecret(t, ca)
			tt.mutate(s)
			client := fake.NewClientset(s)
			_, err := start(context.Background(), client, ns, name)
			if err == nil {
				t.Fatal("Ensure accepted a bad Secret")
			}
			for _, want := range []string{"CA Secret " + ns + "/" + name, tt.wantErr} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if w := writes(client); len(w) != 0 {
				t.Errorf("wrote %v after a bad Secret, want nothing (never a silent new CA)", w)
			}
		})
	}
}
