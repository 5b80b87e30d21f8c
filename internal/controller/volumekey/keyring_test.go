package volumekey

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func testRing(t *testing.T, ids ...string) *Keyring {
	t.Helper()
	keks := map[string][]byte{}
	for i, id := range ids {
		keks[id] = bytes.Repeat([]byte{byte(i + 1)}, KeySize)
	}
	r, err := NewKeyring(keks)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestWrapUnwrap(t *testing.T) {
	r := testRing(t, "1", "2")
	if r.Newest() != "2" {
		t.Fatalf("newest = %s", r.Newest())
	}
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	id, other := KeyIDFor("pvc-a"), KeyIDFor("pvc-b")
	w, err := r.Wrap(id, key)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(w, "carve1.2.") || strings.Contains(w, string(key)) {
		t.Fatalf("wrapped = %q", w)
	}
	got, err := r.Unwrap(id, w)
	if err != nil || !bytes.Equal(got, key) {
		t.Fatalf("Unwrap = %x, %v", got, err)
	}
	// The associated data binds the wrapped key to its key ID: another
	// volume's key ID does not open it.
	if _, err := r.Unwrap(other, w); !errors.Is(err, ErrUnwrap) {
		t.Errorf("Unwrap under another key ID = %v, want ErrUnwrap", err)
	}
	// Altered data, another KEK ID, a KEK the ring lacks, garbage.
	b := []byte(w)
	b[len(b)-2] ^= 1
	for name, bad := range map[string]string{
		"altered":   string(b),
		"other KEK": strings.Replace(w, "carve1.2.", "carve1.1.", 1),
		"lost KEK":  strings.Replace(w, "carve1.2.", "carve1.9.", 1),
		"garbage":   "nonsense",
		"short":     "carve1.2.AAAA",
	} {
		if _, err := r.Unwrap(id, bad); !errors.Is(err, ErrUnwrap) {
			t.Errorf("Unwrap of %s = %v, want ErrUnwrap", name, err)
		}
	}
	// A ring without KEK 2 cannot open it; one with only KEK 2 can.
	if _, err := testRing(t, "1").Unwrap(id, w); !errors.Is(err, ErrUnwrap) {
		t.Errorf("a ring without the KEK unwrapped: %v", err)
	}
}

func TestRewrap(t *testing.T) {
	old := testRing(t, "1")
	key, _ := NewKey()
	id := KeyIDFor("pvc-a")
	w1, err := old.Wrap(id, key)
	if err != nil {
		t.Fatal(err)
	}
	both := testRing(t, "1", "2")
	w2, changed, err := both.Rewrap(id, w1)
	if err != nil || !changed {
		t.Fatalf("Rewrap = %v, %v", changed, err)
	}
	if k, _ := KEKOf(w2); k != "2" {
		t.Errorf("rewrapped under %s", k)
	}
	if got, err := both.Unwrap(id, w2); err != nil || !bytes.Equal(got, key) {
		t.Errorf("rewrapped key = %x, %v", got, err)
	}
	if _, changed, _ := both.Rewrap(id, w2); changed {
		t.Error("a key under the newest KEK was wrapped again")
	}
}

func TestNewKeyringRefuses(t *testing.T) {
	k := bytes.Repeat([]byte{1}, KeySize)
	for name, keks := range map[string]map[string][]byte{
		"none":      {},
		"zero ID":   {"0": k},
		"named ID":  {"a": k},
		"padded ID": {"01": k},
		"short":     {"1": k[:16]},
	} {
		if _, err := NewKeyring(keks); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if r := testRing(t, "10", "9", "2"); r.Newest() != "10" || strings.Join(r.IDs(), ",") != "2,9,10" {
		t.Errorf("newest %s, IDs %v", r.Newest(), r.IDs())
	}
}

func TestKeyIDFor(t *testing.T) {
	a := KeyIDFor("pvc-a")
	if a != KeyIDFor("pvc-a") || a == KeyIDFor("pvc-b") || !ValidKeyID(a) {
		t.Errorf("KeyIDFor: %q", a)
	}
	if ValidKeyID(strings.ToUpper(a)) || ValidKeyID(a[:30]) {
		t.Error("ValidKeyID accepts malformed IDs")
	}
}
