// Package volumekey keeps the keys of carve's encrypted volumes on the
// controller's side (docs/architecture.md, "Encrypted volumes"): KEKs in a
// Secret only the controller reads, wrapping each volume key under the
// newest KEK, and releasing an unwrapped key to the one node holding the
// volume. A wrapped key is AES-256-GCM bound to its volume's key ID, so one
// copied into another volume's request does not unwrap.
package volumekey

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// KeySize is the size of a volume key and of a KEK: 256 bits.
const KeySize = 32

// wrapPrefix versions the wrapped-key format.
const wrapPrefix = "carve1"

// ErrUnwrap is a wrapped key that does not open: another volume's, under an
// unknown KEK, or altered.
var ErrUnwrap = errors.New("the wrapped key does not unwrap")

// Keyring holds the KEKs by decimal ID; the highest wraps new keys.
type Keyring struct {
	keks   map[string][]byte
	newest string
}

// NewKeyring checks keks (ID to KeySize-byte key, at least one) and returns
// their keyring.
func NewKeyring(keks map[string][]byte) (*Keyring, error) {
	if len(keks) == 0 {
		return nil, errors.New("no key-encryption key")
	}
	r := &Keyring{keks: map[string][]byte{}}
	best := uint64(0)
	for id, k := range keks {
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil || n == 0 || strconv.FormatUint(n, 10) != id {
			return nil, fmt.Errorf("key-encryption key ID %q: not a positive decimal number", id)
		}
		if len(k) != KeySize {
			return nil, fmt.Errorf("key-encryption key %s: %d bytes, want %d", id, len(k), KeySize)
		}
		r.keks[id] = slices.Clone(k)
		if n > best {
			best, r.newest = n, id
		}
	}
	return r, nil
}

// Newest is the ID of the KEK that wraps new keys.
func (r *Keyring) Newest() string { return r.newest }

// IDs lists the KEK IDs, oldest first.
func (r *Keyring) IDs() []string {
	ids := slices.Collect(maps.Keys(r.keks))
	slices.SortFunc(ids, func(a, b string) int {
		x, _ := strconv.ParseUint(a, 10, 64)
		y, _ := strconv.ParseUint(b, 10, 64)
		return int(x) - int(y)
	})
	return ids
}

// Has tells whether the keyring holds KEK id.
func (r *Keyring) Has(id string) bool { _, ok := r.keks[id]; return ok }

// NewKey returns a new random volume key.
func NewKey() ([]byte, error) {
	k := make([]byte, KeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("making a volume key: %w", err)
	}
	return k, nil
}

// KeyIDFor is the key ID of the volume of CSI name name: a hash, so a
// repeated CreateVolume names the same ID. A restore or clone keeps its
// source's.
func KeyIDFor(name string) string {
	h := sha256.Sum256([]byte("carve.dev/volume-key-id\x00" + name))
	return hex.EncodeToString(h[:16])
}

// ValidKeyID tells whether id is the form KeyIDFor makes.
func ValidKeyID(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

func additionalData(keyID, kekID string) []byte {
	return []byte("carve.dev/volume-key/v1\x00" + keyID + "\x00" + kekID)
}

func (r *Keyring) aead(kekID string) (cipher.AEAD, error) {
	k, ok := r.keks[kekID]
	if !ok {
		return nil, fmt.Errorf("key-encryption key %s is not in the keyring: %w", kekID, ErrUnwrap)
	}
	b, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// Wrap wraps key for keyID under the newest KEK:
// "carve1.<KEK ID>.<base64url of nonce and sealed key>".
func (r *Keyring) Wrap(keyID string, key []byte) (string, error) {
	return r.wrapWith(r.newest, keyID, key)
}

func (r *Keyring) wrapWith(kekID, keyID string, key []byte) (string, error) {
	if len(key) != KeySize {
		return "", fmt.Errorf("volume key: %d bytes, want %d", len(key), KeySize)
	}
	if !ValidKeyID(keyID) {
		return "", fmt.Errorf("key ID %q: not 32 lower-case hex digits", keyID)
	}
	g, err := r.aead(kekID)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, g.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("wrapping a volume key: %w", err)
	}
	sealed := g.Seal(nonce, nonce, key, additionalData(keyID, kekID))
	return wrapPrefix + "." + kekID + "." + base64.RawURLEncoding.EncodeToString(sealed), nil
}

// KEKOf is the ID of the KEK a wrapped key was made under.
func KEKOf(wrapped string) (string, error) {
	kek, _, err := split(wrapped)
	return kek, err
}

func split(wrapped string) (kek string, sealed []byte, err error) {
	parts := strings.Split(wrapped, ".")
	if len(parts) != 3 || parts[0] != wrapPrefix {
		return "", nil, fmt.Errorf("not a wrapped key of carve's (%s.<KEK>.<data>): %w", wrapPrefix, ErrUnwrap)
	}
	sealed, err = base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return "", nil, fmt.Errorf("wrapped key: %w: %w", err, ErrUnwrap)
	}
	return parts[1], sealed, nil
}

// Unwrap returns the key wrapped holds for keyID, or ErrUnwrap.
func (r *Keyring) Unwrap(keyID, wrapped string) ([]byte, error) {
	kek, sealed, err := split(wrapped)
	if err != nil {
		return nil, err
	}
	g, err := r.aead(kek)
	if err != nil {
		return nil, err
	}
	if len(sealed) < g.NonceSize()+g.Overhead() {
		return nil, fmt.Errorf("wrapped key too short: %w", ErrUnwrap)
	}
	key, err := g.Open(nil, sealed[:g.NonceSize()], sealed[g.NonceSize():], additionalData(keyID, kek))
	if err != nil {
		return nil, fmt.Errorf("under key-encryption key %s for key ID %s: %w", kek, keyID, ErrUnwrap)
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("unwrapped key of %d bytes: %w", len(key), ErrUnwrap)
	}
	return key, nil
}

// Rewrap wraps the key again under the newest KEK; changed is false when
// it was already.
func (r *Keyring) Rewrap(keyID, wrapped string) (out string, changed bool, err error) {
	kek, err := KEKOf(wrapped)
	if err != nil {
		return "", false, err
	}
	if kek == r.newest {
		return wrapped, false, nil
	}
	key, err := r.Unwrap(keyID, wrapped)
	if err != nil {
		return "", false, err
	}
	defer clear(key)
	out, err = r.Wrap(keyID, key)
	return out, err == nil, err
}
