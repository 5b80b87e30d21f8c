package volumekey

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/pvindex"
)

type fakeHolders map[string][]pvindex.Holder

func (f fakeHolders) HoldersOf(h string) ([]pvindex.Holder, error) { return f[h], nil }

type fixedKeys struct{ r *Keyring }

func (k fixedKeys) Keyring(context.Context) (*Keyring, error) { return k.r, nil }
func (k fixedKeys) Reload(context.Context) (*Keyring, error)  { return k.r, nil }

// TestReleaseOnlyToTheVolumesNode: the controller unwraps a volume key
// only for the node its PersistentVolume pins the volume to, and only
// for the key ID that PersistentVolume records; each refusal is counted
// by node and reason.
func TestReleaseOnlyToTheVolumesNode(t *testing.T) {
	ring := testRing(t, "1")
	keyA, _ := NewKey()
	keyB, _ := NewKey()
	idA, idB := KeyIDFor("pvc-a"), KeyIDFor("pvc-b")
	wA, _ := ring.Wrap(idA, keyA)
	wB, _ := ring.Wrap(idB, keyB)
	const volA, volB = "vg/carve-aaaa", "vg/carve-bbbb"
	holders := fakeHolders{
		volA: {{PV: "pvc-a", Node: "n1", KeyID: idA}},
		volB: {{PV: "pvc-b", Node: "n2", KeyID: idB}},
	}
	reg := prometheus.NewRegistry()
	r, err := NewReleaser(fixedKeys{ring}, holders, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ask := func(node, vol, keyID, wrapped string) *nodeagentv1.VolumeKeyAnswer {
		return r.Answer(ctx, node, &nodeagentv1.VolumeKeyRequest{RequestId: 7, VolumeId: vol, KeyId: keyID, WrappedKey: wrapped})
	}

	if a := ask("n1", volA, idA, wA); !bytes.Equal(a.GetKey(), keyA) || a.GetRefused() != "" || a.GetRequestId() != 7 {
		t.Fatalf("the volume's own node: %+v", a)
	}
	for _, c := range []struct {
		name, node, vol, keyID, wrapped, reason string
	}{
		// n1 asks for n2's volume, with everything of it right.
		{"another node's volume", "n1", volB, idB, wB, RefusedOtherNode},
		// n1 asks for its own volume with the key ID of another volume
		// (whose wrapped key it kept from when that volume was here).
		{"another volume's key ID", "n1", volA, idB, wB, RefusedKeyID},
		// n1 asks for its own volume and key ID with another volume's
		// wrapped key: it does not unwrap under that key ID.
		{"another volume's wrapped key", "n1", volA, idA, wB, RefusedUnwrap},
		{"no PV", "n1", "vg/carve-cccc", idA, wA, RefusedNoVolume},
		{"not an ID", "n1", "nonsense", idA, wA, RefusedVolumeID},
	} {
		a := ask(c.node, c.vol, c.keyID, c.wrapped)
		if len(a.GetKey()) != 0 || a.GetRefused() == "" {
			t.Errorf("%s: released %+v", c.name, a)
			continue
		}
		if got := testutil.ToFloat64(r.refused.WithLabelValues(c.node, c.reason)); got != 1 {
			t.Errorf("%s: refusals{node=%s,reason=%s} = %v, want 1 (answer %q)", c.name, c.node, c.reason, got, a.GetRefused())
		}
	}
	if got := testutil.ToFloat64(r.released); got != 1 {
		t.Errorf("released = %v, want 1", got)
	}
	// A volume two PVs hold, one of them on another node, is refused too.
	holders[volA] = append(holders[volA], pvindex.Holder{PV: "pvc-a2", Node: "n2", KeyID: idA})
	if a := ask("n1", volA, idA, wA); len(a.GetKey()) != 0 || !strings.Contains(a.GetRefused(), "pvc-a2") {
		t.Errorf("a volume also pinned to another node: %+v", a)
	}
}

// TestReleaseRewrapsUnderTheNewestKEK: a key wrapped under an older KEK is
// released with the same key wrapped under the newest, for the node to
// write into the header; one under the newest is not.
func TestReleaseRewrapsUnderTheNewestKEK(t *testing.T) {
	old := testRing(t, "1")
	both := testRing(t, "1", "2")
	key, _ := NewKey()
	id := KeyIDFor("pvc-a")
	w1, _ := old.Wrap(id, key)
	const vol = "vg/carve-aaaa"
	r, err := NewReleaser(fixedKeys{both}, fakeHolders{vol: {{PV: "pvc-a", Node: "n1", KeyID: id}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := r.Answer(context.Background(), "n1", &nodeagentv1.VolumeKeyRequest{VolumeId: vol, KeyId: id, WrappedKey: w1})
	if !bytes.Equal(a.GetKey(), key) || a.GetRewrappedKey() == "" {
		t.Fatalf("answer %+v", a)
	}
	if k, _ := KEKOf(a.GetRewrappedKey()); k != "2" {
		t.Errorf("rewrapped under KEK %s", k)
	}
	if got, err := both.Unwrap(id, a.GetRewrappedKey()); err != nil || !bytes.Equal(got, key) {
		t.Errorf("the rewrapped key unwraps to %x, %v", got, err)
	}
	a = r.Answer(context.Background(), "n1", &nodeagentv1.VolumeKeyRequest{VolumeId: vol, KeyId: id, WrappedKey: a.GetRewrappedKey()})
	if len(a.GetKey()) == 0 || a.GetRewrappedKey() != "" {
		t.Errorf("a key under the newest KEK: %+v", a)
	}
}
