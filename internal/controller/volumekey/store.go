package volumekey

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

const kekDataPrefix = "kek-"

// RotateAnnotation on the Secret asks for a new KEK; the first replica to
// read it adds one and removes the annotation.
const RotateAnnotation = "carve.dev/rotate-kek"

// reloadEvery bounds a keyring read's age, so rotations reach every replica.
const reloadEvery = time.Minute

// DefaultSecret is the Secret's name in the controller's namespace.
const DefaultSecret = "carve-volume-kek" //nolint:gosec // G101: a Secret's name, not a credential

// Store reads the keyring from its Secret, makes it when absent, and adds
// KEKs. It is safe for concurrent use.
type Store struct {
	client          kubernetes.Interface
	namespace, name string

	mu   sync.Mutex
	ring *Keyring
	read time.Time // when ring was read
}

// NewStore returns the store of the Secret namespace/name.
func NewStore(client kubernetes.Interface, namespace, name string) *Store {
	return &Store{client: client, namespace: namespace, name: name}
}

// Keyring is the keyring as last read; the first call reads (or makes) the
// Secret.
func (s *Store) Keyring(ctx context.Context) (*Keyring, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ring != nil && time.Since(s.read) < reloadEvery {
		return s.ring, nil
	}
	ring, err := s.load(ctx)
	if err != nil && s.ring != nil {
		// The last keyring still opens every volume it opened.
		klog.FromContext(ctx).Error(err, "Reading the key-encryption Secret again; keeping the keys read before")
		return s.ring, nil
	}
	return ring, err
}

// Reload reads the Secret again to learn another replica's new KEK.
func (s *Store) Reload(ctx context.Context) (*Keyring, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.load(ctx)
}

func (s *Store) where() string { return s.namespace + "/" + s.name }

func (s *Store) load(ctx context.Context) (*Keyring, error) {
	sec, err := s.client.CoreV1().Secrets(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sec, err = s.create(ctx)
	}
	if err != nil {
		return nil, err
	}
	if _, ok := sec.Annotations[RotateAnnotation]; ok {
		if sec, err = s.addKEK(ctx, sec); err != nil {
			return nil, err
		}
	}
	ring, err := fromSecret(sec)
	if err != nil {
		return nil, fmt.Errorf("key-encryption Secret %s: %w (restore it from a backup: without it no encrypted volume opens)", s.where(), err)
	}
	s.ring, s.read = ring, time.Now()
	return ring, nil
}

// create makes the Secret with KEK 1; a replica that won the race is read
// back.
func (s *Store) create(ctx context.Context) (*corev1.Secret, error) {
	kek, err := newKEK()
	if err != nil {
		return nil, err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "carve-controller"}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{kekDataPrefix + "1": kek},
	}
	created, err := s.client.CoreV1().Secrets(s.namespace).Create(ctx, sec, metav1.CreateOptions{})
	switch {
	case err == nil:
		klog.FromContext(ctx).Info("Created the key-encryption key of encrypted volumes", "secret", s.where(), "kek", "1")
		return created, nil
	case apierrors.IsAlreadyExists(err):
		got, err := s.client.CoreV1().Secrets(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("reading key-encryption Secret %s: %w", s.where(), err)
		}
		return got, nil
	}
	return nil, fmt.Errorf("creating key-encryption Secret %s: %w", s.where(), err)
}

// Rotate adds a new KEK, which wraps every key from then on, and returns its
// ID. A KEK leaves the Secret only by hand, once nothing is wrapped under it.
func (s *Store) Rotate(ctx context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.load(ctx); err != nil {
		return "", err
	}
	sec, err := s.client.CoreV1().Secrets(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading key-encryption Secret %s: %w", s.where(), err)
	}
	if sec, err = s.addKEK(ctx, sec); err != nil {
		return "", err
	}
	if s.ring, err = fromSecret(sec); err != nil {
		return "", err
	}
	s.read = time.Now()
	return s.ring.Newest(), nil
}

// addKEK writes sec back with one more KEK and without RotateAnnotation; a
// conflict (another replica rotated first) reads the Secret again.
func (s *Store) addKEK(ctx context.Context, sec *corev1.Secret) (*corev1.Secret, error) {
	ring, err := fromSecret(sec)
	if err != nil {
		return nil, fmt.Errorf("key-encryption Secret %s: %w", s.where(), err)
	}
	n, _ := strconv.ParseUint(ring.Newest(), 10, 64)
	id := strconv.FormatUint(n+1, 10)
	kek, err := newKEK()
	if err != nil {
		return nil, err
	}
	sec = sec.DeepCopy()
	sec.Data[kekDataPrefix+id] = kek
	delete(sec.Annotations, RotateAnnotation)
	// The resourceVersion turns a concurrent rotation into a conflict, not a
	// lost KEK.
	updated, err := s.client.CoreV1().Secrets(s.namespace).Update(ctx, sec, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		got, gerr := s.client.CoreV1().Secrets(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
		if gerr != nil {
			return nil, fmt.Errorf("reading key-encryption Secret %s: %w", s.where(), gerr)
		}
		return got, nil
	}
	if err != nil {
		return nil, fmt.Errorf("adding key-encryption key %s to Secret %s: %w", id, s.where(), err)
	}
	klog.FromContext(ctx).Info("Added a key-encryption key; new volume keys are wrapped under it, and each volume's key is wrapped again at its next stage", "secret", s.where(), "kek", id)
	return updated, nil
}

func newKEK() ([]byte, error) {
	k := make([]byte, KeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("making a key-encryption key: %w", err)
	}
	return k, nil
}

// fromSecret reads the kek-<ID> entries; others are ignored.
func fromSecret(sec *corev1.Secret) (*Keyring, error) {
	keks := map[string][]byte{}
	for k, v := range sec.Data {
		if id, ok := strings.CutPrefix(k, kekDataPrefix); ok {
			keks[id] = v
		}
	}
	return NewKeyring(keks)
}
