// Package castore keeps the node channel's CA in a kubernetes.io/tls-shaped
// Secret only the controller reads (cert-manager can supply it) and the
// trusted certificates in a ConfigMap of the same name. It rotates in three
// steps, each one Secret write so replicas agree: staged, switched once
// every agent accepts, dropped once the old CA's last leaf expired
// (docs/architecture.md, "CA rotation"). An expired CA is replaced at once.
package castore

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
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

// BundleKey is the ConfigMap key of the trusted CA certificates (PEM).
const BundleKey = "ca.crt"

// The Secret's keys beside tls.crt and tls.key, and its annotations.
const (
	nextCertKey     = "next.crt"
	nextKeyKey      = "next.key"
	previousCertKey = "previous.crt"
	// RotateAnnotation on the Secret asks for a rotation now; the controller
	// removes it when it stages the next CA.
	RotateAnnotation     = "carve.dev/rotate-ca"
	nextSinceAnnotation  = "carve.dev/ca-next-since"
	previousTrustedUntil = "carve.dev/ca-previous-trusted-until"
	annotationTimeLayout = time.RFC3339
)

var managedBy = map[string]string{"app.kubernetes.io/managed-by": "carve-controller"}

// State is where the CA stands.
type State struct {
	// Active signs every certificate.
	Active *nodeca.CA
	// Next is trusted but does not sign yet; staged at NextSince.
	Next      *nodeca.CA
	NextSince time.Time
	// Previous signed before Active; trusted until PreviousUntil.
	Previous      *x509.Certificate
	PreviousUntil time.Time
	// RotateRequested: an operator asked for a rotation.
	RotateRequested bool
}

// Trusted is what a peer's certificate may chain to: active, next, previous.
func (s State) Trusted() []*x509.Certificate {
	out := []*x509.Certificate{s.Active.Cert}
	if s.Next != nil {
		out = append(out, s.Next.Cert)
	}
	if s.Previous != nil {
		out = append(out, s.Previous)
	}
	return out
}

// SameCA reports whether a and b are the same CA.
func SameCA(a, b *nodeca.CA) bool {
	return a != nil && b != nil && bytes.Equal(a.Cert.Raw, b.Cert.Raw)
}

func sameCAs(a, b State) bool {
	x, y := a.Trusted(), b.Trusted()
	if len(x) != len(y) || (a.Next == nil) != (b.Next == nil) || (a.Previous == nil) != (b.Previous == nil) {
		return false
	}
	for i := range x {
		if !bytes.Equal(x[i].Raw, y[i].Raw) {
			return false
		}
	}
	return true
}

// Policy is when the store rotates.
type Policy struct {
	// Validity of the CAs it makes; 0 means nodeca.DefaultCAValidity.
	Validity time.Duration
	// Propagation is the longest a next CA waits for every agent to trust it
	// before it signs anyway (the kubelet updates a ConfigMap mount within about
	// a minute); 0 means DefaultPropagation.
	Propagation time.Duration
	// Overlap is how long the previous CA stays trusted after the switch (DefaultOverlap
	// for 0), at most a sixth of the new CA's life so a short-lived CA can rotate again.
	Overlap time.Duration
}

// DefaultPropagation is Policy.Propagation's default.
const DefaultPropagation = 10 * time.Minute

// DefaultOverlap is Policy.Overlap's default.
const DefaultOverlap = time.Hour

func (p Policy) withDefaults() Policy {
	if p.Validity == 0 {
		p.Validity = nodeca.DefaultCAValidity
	}
	if p.Propagation == 0 {
		p.Propagation = DefaultPropagation
	}
	if p.Overlap == 0 {
		p.Overlap = DefaultOverlap
	}
	return p
}

type step string

// The rotation steps, carve_node_channel_ca_rotations_total's label values.
const (
	stepNone     step = ""
	stepStage    step = "staged"
	stepSwitch   step = "switched"
	stepDrop     step = "dropped"
	stepReplaced step = "replaced"
)

// plan is the next step from s at now. Switching waits for every agent to
// accept the next CA (nextTrusted), the Propagation, or the active CA's last
// sixth of life.
func plan(s State, now time.Time, p Policy, nextTrusted bool) step {
	a := s.Active.Cert
	life := lifeOf(a)
	left := a.NotAfter.Sub(now)
	switch {
	case left <= 0:
		return stepReplaced
	case s.Previous != nil && !now.Before(s.PreviousUntil):
		return stepDrop
	case s.Next == nil && s.Previous == nil && (s.RotateRequested || left < life/3):
		return stepStage
	case s.Next != nil && (nextTrusted || now.Sub(s.NextSince) >= p.Propagation || left < life/6):
		return stepSwitch
	}
	return stepNone
}

// lifeOf is the CA's intended life; NotBefore is backdated by
// nodeca.ClockSkew (a foreign CA just rotates a little sooner).
func lifeOf(c *x509.Certificate) time.Duration {
	return c.NotAfter.Sub(c.NotBefore.Add(nodeca.ClockSkew))
}

func apply(s State, st step, now time.Time, p Policy, newCA func() (*nodeca.CA, error)) (State, error) {
	switch st {
	case stepStage:
		next, err := newCA()
		if err != nil {
			return s, err
		}
		s.Next, s.NextSince, s.RotateRequested = next, now, false
	case stepSwitch:
		s.Previous = s.Active.Cert
		s.PreviousUntil = now.Add(min(p.Overlap, lifeOf(s.Next.Cert)/6))
		if s.Previous.NotAfter.Before(s.PreviousUntil) {
			// No leaf it signed outlives it.
			s.PreviousUntil = s.Previous.NotAfter
		}
		s.Active, s.Next, s.NextSince = s.Next, nil, time.Time{}
	case stepDrop:
		s.Previous, s.PreviousUntil = nil, time.Time{}
	case stepReplaced:
		if s.Next != nil && now.Before(s.Next.Cert.NotAfter) {
			s.Active = s.Next
		} else {
			ca, err := newCA()
			if err != nil {
				return s, err
			}
			s.Active = ca
		}
		s.Next, s.NextSince, s.Previous, s.PreviousUntil, s.RotateRequested = nil, time.Time{}, nil, time.Time{}, false
	}
	return s, nil
}

func read(ctx context.Context, client kubernetes.Interface, namespace, name string) (*corev1.Secret, State, error) {
	s, err := client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, State{}, nil
	}
	if err != nil {
		return nil, State{}, fmt.Errorf("reading CA Secret %s/%s: %w", namespace, name, err)
	}
	st, err := fromSecret(s)
	return s, st, err
}

// fromSecret parses s; an error names the Secret and says how to start over.
func fromSecret(s *corev1.Secret) (State, error) {
	where := fmt.Sprintf("CA Secret %s/%s", s.Namespace, s.Name)
	const fix = "fix or delete the Secret (a new CA then replaces it, and every node certificate is reissued)"
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
		if len(s.Data[k]) == 0 {
			return State{}, fmt.Errorf("%s: no %s: %s", where, k, fix)
		}
	}
	var st State
	var err error
	if st.Active, err = nodeca.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return State{}, fmt.Errorf("%s: %w: %s", where, err, fix)
	}
	if len(s.Data[nextCertKey]) > 0 {
		if st.Next, err = nodeca.ParseCA(s.Data[nextCertKey], s.Data[nextKeyKey]); err != nil {
			return State{}, fmt.Errorf("%s: %s: %w: %s", where, nextCertKey, err, fix)
		}
		if st.NextSince, err = annotationTime(s, nextSinceAnnotation); err != nil {
			return State{}, fmt.Errorf("%s: %w: %s", where, err, fix)
		}
	}
	if len(s.Data[previousCertKey]) > 0 {
		certs, err := nodeca.ParseBundle(s.Data[previousCertKey])
		if err != nil {
			return State{}, fmt.Errorf("%s: %s: %w: %s", where, previousCertKey, err, fix)
		}
		if len(certs) != 1 {
			return State{}, fmt.Errorf("%s: %s: %d certificates, want one: %s", where, previousCertKey, len(certs), fix)
		}
		st.Previous = certs[0]
		if st.PreviousUntil, err = annotationTime(s, previousTrustedUntil); err != nil {
			return State{}, fmt.Errorf("%s: %w: %s", where, err, fix)
		}
	}
	_, st.RotateRequested = s.Annotations[RotateAnnotation]
	return st, nil
}

func annotationTime(s *corev1.Secret, key string) (time.Time, error) {
	t, err := time.Parse(annotationTimeLayout, s.Annotations[key])
	if err != nil {
		return time.Time{}, fmt.Errorf("annotation %s: %w", key, err)
	}
	return t, nil
}

// toSecret writes st into a copy of s, keeping its other labels and
// annotations.
func toSecret(s *corev1.Secret, st State) (*corev1.Secret, error) {
	s = s.DeepCopy()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	for _, k := range []string{nextCertKey, nextKeyKey, previousCertKey} {
		delete(s.Data, k)
	}
	for _, k := range []string{nextSinceAnnotation, previousTrustedUntil, RotateAnnotation} {
		delete(s.Annotations, k)
	}
	var err error
	if s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], err = st.Active.MarshalPEM(); err != nil {
		return nil, err
	}
	if st.Next != nil {
		if s.Data[nextCertKey], s.Data[nextKeyKey], err = st.Next.MarshalPEM(); err != nil {
			return nil, err
		}
		s.Annotations[nextSinceAnnotation] = st.NextSince.UTC().Format(annotationTimeLayout)
	}
	if st.Previous != nil {
		s.Data[previousCertKey] = pemOf(st.Previous)
		s.Annotations[previousTrustedUntil] = st.PreviousUntil.UTC().Format(annotationTimeLayout)
	}
	if st.RotateRequested {
		s.Annotations[RotateAnnotation] = "requested"
	}
	return s, nil
}

func pemOf(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// create makes the Secret with a new CA; a replica that won the race is
// read back.
func create(ctx context.Context, client kubernetes.Interface, namespace, name string, p Policy) (State, error) {
	ca, err := nodeca.NewCA(nodeca.CAOptions{Validity: p.Validity})
	if err != nil {
		return State{}, fmt.Errorf("making the CA for Secret %s/%s: %w", namespace, name, err)
	}
	s, err := toSecret(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: managedBy},
		Type:       corev1.SecretTypeTLS,
	}, State{Active: ca})
	if err != nil {
		return State{}, fmt.Errorf("making the CA for Secret %s/%s: %w", namespace, name, err)
	}
	created, err := client.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{})
	switch {
	case err == nil:
		klog.FromContext(ctx).Info("Created the node channel CA", "secret", namespace+"/"+name, "notAfter", ca.Cert.NotAfter)
		return fromSecret(created)
	case apierrors.IsAlreadyExists(err):
		_, st, err := read(ctx, client, namespace, name)
		if err == nil && st.Active == nil {
			err = fmt.Errorf("CA Secret %s/%s: gone right after another replica created it", namespace, name)
		}
		return st, err
	default:
		return State{}, fmt.Errorf("creating CA Secret %s/%s: %w", namespace, name, err)
	}
}

func ensureBundle(ctx context.Context, client kubernetes.Interface, namespace, name string, certs []*x509.Certificate) error {
	log := klog.FromContext(ctx)
	maps := client.CoreV1().ConfigMaps(namespace)
	want := pemOf(certs...)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := maps.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: managedBy},
				Data:       map[string]string{BundleKey: string(want)},
			}
			_, err = maps.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// Another replica made it; a Conflict is retried.
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
		if holdsExactly(cm.Data[BundleKey], certs) {
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
		log.Info("Published the trusted CAs", "configMap", namespace+"/"+name, "cas", len(certs))
		return nil
	})
	if err != nil {
		return fmt.Errorf("publishing the CA in ConfigMap %s/%s: %w", namespace, name, err)
	}
	return nil
}

// holdsExactly reports whether bundle is exactly certs in order: a dropped
// CA (a leaked key, say) must not stay trusted by accident.
func holdsExactly(bundle string, certs []*x509.Certificate) bool {
	got, err := nodeca.ParseBundle([]byte(bundle))
	if err != nil || len(got) != len(certs) {
		return false
	}
	for i := range got {
		if !bytes.Equal(got[i].Raw, certs[i].Raw) {
			return false
		}
	}
	return true
}
