// Package castore keeps the node channel's CA (internal/nodeca) in Kubernetes:
// the CA's certificate and key in a Secret that only the controller may
// read, and its certificate alone in a ConfigMap of the same name that the
// node DaemonSet mounts to know which controller to trust.
//
// The Secret has the layout of a kubernetes.io/tls Secret (tls.crt,
// tls.key), the layout cert-manager's CA issuer reads, so a CA made by
// cert-manager can be put in its place.
//
// Rotation of the CA itself is not done here yet. It would go: make the
// next CA and keep it beside the current one (a second Secret, say
// <name>-next); publish both certificates in ca.crt (the bundle holds any
// number of PEM blocks, and nodeca.ParseBundle reads them all), and wait until
// every node agent has reloaded the mounted bundle into its nodeca.Pool;
// switch the Secret to the next CA, so the controller's certificate and
// every node certificate are reissued by it at their next renewal; once
// the last certificate of the old CA has expired, drop it from ca.crt.
// Until then Ensure writes ca.crt as exactly the current CA: a CA that was
// replaced (its key leaked, say) must not stay trusted by accident.
package castore

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/nodeca"
)

// BundleKey is the key of the ConfigMap that holds the trusted CA
// certificates, PEM, one block each.
const BundleKey = "ca.crt"

// expiryWarning is how long before the CA expires Ensure starts warning.
const expiryWarning = 30 * 24 * time.Hour

// managedBy labels what Ensure creates, so that an operator sees who made it.
var managedBy = map[string]string{"app.kubernetes.io/managed-by": "carve-controller"}

// Ensure returns the CA stored in Secret <name> of namespace, creating it
// with nodeca.NewCA when the Secret does not exist, and makes ConfigMap
// <name> hold ca.crt = the CA's certificate, writing it only when it
// holds anything else. Replicas may call it at the same time: the first
// Create wins and every other caller reads that CA back. A Secret that
// exists but does not hold a usable CA is an error naming it; it is never
// replaced by a new CA silently, since every node would stop trusting the
// controller.
func Ensure(ctx context.Context, client kubernetes.Interface, namespace, name string) (*nodeca.CA, error) {
	if client == nil || namespace == "" || name == "" {
		return nil, errors.New("CA store: a client, a namespace and a name are required")
	}
	ca, err := ensureSecret(ctx, client, namespace, name)
	if err != nil {
		return nil, err
	}
	if left := time.Until(ca.Cert.NotAfter); left < expiryWarning {
		klog.FromContext(ctx).Info("Warning: the node channel CA expires soon and carve does not rotate it yet; "+
			"delete the Secret before then and restart the controller (every node certificate is reissued)",
			"secret", namespace+"/"+name, "notAfter", ca.Cert.NotAfter, "left", left.Round(time.Hour))
	}
	if err := ensureBundle(ctx, client, namespace, name, ca.Cert); err != nil {
		return nil, err
	}
	return ca, nil
}

func ensureSecret(ctx context.Context, client kubernetes.Interface, namespace, name string) (*nodeca.CA, error) {
	log := klog.FromContext(ctx)
	secrets := client.CoreV1().Secrets(namespace)
	s, err := secrets.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		return fromSecret(s)
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading CA Secret %s/%s: %w", namespace, name, err)
	}
	ca, err := nodeca.NewCA(nodeca.CAOptions{})
	if err != nil {
		return nil, fmt.Errorf("making the CA for Secret %s/%s: %w", namespace, name, err)
	}
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		return nil, fmt.Errorf("making the CA for Secret %s/%s: %w", namespace, name, err)
	}
	s = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: managedBy},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
	}
	created, err := secrets.Create(ctx, s, metav1.CreateOptions{})
	switch {
	case err == nil:
		log.Info("Created the node channel CA", "secret", namespace+"/"+name, "notAfter", ca.Cert.NotAfter)
		return fromSecret(created)
	case apierrors.IsAlreadyExists(err):
		// Another replica won the race: its CA is the one.
		s, err = secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("reading CA Secret %s/%s another replica created: %w", namespace, name, err)
		}
		return fromSecret(s)
	default:
		return nil, fmt.Errorf("creating CA Secret %s/%s: %w", namespace, name, err)
	}
}

// fromSecret parses the CA of s; an error names the Secret and says how to
// start over.
func fromSecret(s *corev1.Secret) (*nodeca.CA, error) {
	where := fmt.Sprintf("CA Secret %s/%s", s.Namespace, s.Name)
	const fix = "fix or delete the Secret (a new CA then replaces it, and every node certificate is reissued)"
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
		if len(s.Data[k]) == 0 {
			return nil, fmt.Errorf("%s: no %s: %s", where, k, fix)
		}
	}
	ca, err := nodeca.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", where, err, fix)
	}
	if now := time.Now(); now.After(ca.Cert.NotAfter) {
		return nil, fmt.Errorf("%s: the CA expired at %s: %s", where, ca.Cert.NotAfter.UTC().Format(time.RFC3339), fix)
	}
	return ca, nil
}

// ensureBundle makes ConfigMap <name> hold exactly cert in ca.crt.
func ensureBundle(ctx context.Context, client kubernetes.Interface, namespace, name string, cert *x509.Certificate) error {
	log := klog.FromContext(ctx)
	maps := client.CoreV1().ConfigMaps(namespace)
	want := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := maps.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: managedBy},
				Data:       map[string]string{BundleKey: string(want)},
			}
			_, err = maps.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// Another replica made it; look again (a Conflict is retried).
				return apierrors.NewConflict(corev1.Resource("configmaps"), name, err)
			}
			if err == nil {
				log.Info("Published the node channel CA", "configMap", namespace+"/"+name)
			}
			return err
		}
		if err != nil {
			return err
		}
		if holdsExactly(cm.Data[BundleKey], cert) {
			return nil
		}
		cm = cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[BundleKey] = string(want)
		if _, err := maps.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return err
		}
		log.Info("Replaced the CA bundle: it did not hold exactly the current CA", "configMap", namespace+"/"+name)
		return nil
	})
	if err != nil {
		return fmt.Errorf("publishing the CA in ConfigMap %s/%s: %w", namespace, name, err)
	}
	return nil
}

// holdsExactly reports whether bundle is cert and nothing else, whatever
// the whitespace around it.
func holdsExactly(bundle string, cert *x509.Certificate) bool {
	certs, err := nodeca.ParseBundle([]byte(bundle))
	return err == nil && len(certs) == 1 && bytes.Equal(certs[0].Raw, cert.Raw)
}
