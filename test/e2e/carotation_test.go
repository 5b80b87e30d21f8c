//go:build e2e

package e2e

import (
	"context"
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/carve-csi/carve/internal/controller/castore"
	"github.com/carve-csi/carve/internal/nodeca"
)

// caValidity is the life of the CAs the controller makes in
// TestNodeChannelOutlivesItsCA: a rotation starts when 30 s are left.
const caValidity = 90 * time.Second

// TestNodeChannelOutlivesItsCA runs carve controller with CAs that live
// 90 seconds: asked for a rotation, it switches to such a CA, rotates it
// again on its own before it ends, and a claim made after that first
// short CA expired still binds, so the channel to every node the
// scheduler may pick outlived it. The simulated kubelets write the
// ConfigMap's changes into the agents' mounted bundle, as a kubelet does.
func TestNodeChannelOutlivesItsCA(t *testing.T) {
	ctx := testCtx(t, 8*time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("carve controller log:\n%s", bed.Central.Controller().Tail(80))
		}
	})
	short := []string{"--node-channel-ca-validity=" + caValidity.String(), "--node-channel-ca-propagation=20s"}
	if err := bed.Central.RestartControllerWith(ctx, short); err != nil {
		t.Fatalf("restarting carve controller with short-lived CAs: %v", err)
	}
	t.Cleanup(func() { restoreYearCA(t) })
	requestRotation(t, ctx)
	var first *x509.Certificate
	waitFor(t, time.Minute, "carve controller to switch to a CA of "+caValidity.String(), func(ctx context.Context) (bool, string, error) {
		ca, err := activeCA(ctx)
		if err != nil {
			return false, "", err
		}
		first = ca
		return lifeOf(ca) == caValidity, fmt.Sprintf("the active CA lives %s", lifeOf(ca)), nil
	})

	ns := newNamespace(t, "carotation")
	createPVCAndPod(t, ctx, newPVC(ns, "before", thickSC, "64Mi"), newPod(ns, "before", "before"))
	waitBound(t, ns, "before", time.Minute)

	waitFor(t, 2*caValidity, "the first short CA to be replaced on its own and expire", func(ctx context.Context) (bool, string, error) {
		ca, err := activeCA(ctx)
		if err != nil {
			return false, "", err
		}
		return !ca.Equal(first) && time.Now().After(first.NotAfter.Add(5*time.Second)),
			fmt.Sprintf("active CA serial %s (first %s), first CA ends %s", ca.SerialNumber, first.SerialNumber, first.NotAfter.Format(time.RFC3339)), nil
	})
	trusted, err := trustedCAs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range trusted {
		if c.Equal(first) {
			t.Errorf("the ConfigMap still trusts the CA that ended at %s", first.NotAfter)
		}
	}
	createPVCAndPod(t, ctx, newPVC(ns, "after", thickSC, "64Mi"), newPod(ns, "after", "after"))
	waitBound(t, ns, "after", time.Minute)

	switched, err := scrape(ctx, bed.Central.MetricsURL, "carve_node_channel_ca_rotations_total", `step="switched"`)
	if err != nil {
		t.Fatal(err)
	}
	if switched < 2 {
		t.Errorf("carve_node_channel_ca_rotations_total{step=switched} = %v, want at least 2 (asked for, then on its own)", switched)
	}
}

// lifeOf is how long the controller made the CA to live.
func lifeOf(ca *x509.Certificate) time.Duration {
	return ca.NotAfter.Sub(ca.NotBefore.Add(nodeca.ClockSkew)).Round(time.Second)
}

// restoreYearCA gives the tests that follow the shipped flags and a CA of
// a year again.
func restoreYearCA(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	if err := bed.Central.RestartControllerWith(ctx, nil); err != nil {
		t.Fatalf("restarting carve controller with the shipped flags: %v", err)
	}
	requestRotation(t, ctx)
	waitFor(t, 2*time.Minute, "carve controller to switch to a CA of a year", func(ctx context.Context) (bool, string, error) {
		ca, err := activeCA(ctx)
		if err != nil {
			return false, "", err
		}
		return lifeOf(ca) > 24*time.Hour, fmt.Sprintf("the active CA lives %s", lifeOf(ca)), nil
	})
}

// requestRotation annotates the CA Secret as an operator asking for a
// rotation does.
func requestRotation(t *testing.T, ctx context.Context) {
	t.Helper()
	secrets := bed.Client.CoreV1().Secrets(bed.NodeChannel.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := secrets.Get(ctx, bed.NodeChannel.CAName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[castore.RotateAnnotation] = "now"
		_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("asking for a CA rotation: %v", err)
	}
}

// activeCA is the CA that signs, from the Secret.
func activeCA(ctx context.Context) (*x509.Certificate, error) {
	s, err := bed.Client.CoreV1().Secrets(bed.NodeChannel.Namespace).Get(ctx, bed.NodeChannel.CAName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	certs, err := nodeca.ParseBundle(s.Data[corev1.TLSCertKey])
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// trustedCAs are the CAs of the ConfigMap the nodes mount.
func trustedCAs(ctx context.Context) ([]*x509.Certificate, error) {
	cm, err := bed.Client.CoreV1().ConfigMaps(bed.NodeChannel.Namespace).Get(ctx, bed.NodeChannel.CAName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return nodeca.ParseBundle([]byte(cm.Data[castore.BundleKey]))
}
