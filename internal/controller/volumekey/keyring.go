// Package volumekey keeps the keys of carve's encrypted volumes on the
// controller's side (docs/architecture.md, "Encrypted volumes"): the
// key-encryption keys (KEKs) in a Secret only the controller reads, the
// wrapping of each volume's own key under the newest KEK, and the release
// of an unwrapped key to the one node that holds the volume.
//
// A wrapped key is AES-256-GCM under a KEK, with associated data that
// binds it to its volume's key ID: a wrapped key copied from one volume's
// header into a request for another volume does not unwrap.
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

// wrapPrefix starts every wrapped key: the format's version.
const wrapPrefix = "carve1"

// ErrUnwrap is a wrapped key that does not open: another volume's, made
// under a KEK the keyring does not hold, or altered.
var ErrUnwrap = errors.New("the wrapped key does not unwrap")

// Keyring holds the KEKs by ID; IDs are decimal numbers, and the highest
// is the newest, which wraps new keys.
type Keyring struct {
	keks   map[string][]byte
	newest string
}

// NewKeyring checks keks (ID to key) and returns their keyring: at least
// one, each ID a positive decimal number, each key KeySize bytes.
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

// KeyIDFor is the key ID of the volume made with the CSI name name: 128
// bits of a hash of the name, so that a repeated CreateVolume names the
// same key ID, and the volume's PersistentVolume records it. A restore or
// clone keeps its source's key ID (its data and header are the source's).
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

// additionalData binds a wrapped key to its key ID and KEK.
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

// Wrap wraps key (KeySize bytes) for the volume of keyID under the newest
// KEK: "carve1.<KEK ID>.<base64url of nonce and sealed key>".
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

// Unwrap returns the volume key that wrapped holds for keyID. A key of
// another key ID, under a KEK not in the keyring, or altered, is
// ErrUnwrap.
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

// Rewrap unwraps wrapped and wraps its key again under the newest KEK; a
// key under the newest already is returned as it is (changed false).
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
