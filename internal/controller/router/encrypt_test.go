package router

import (
	"bytes"
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/controller/volumekey"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

type ringKeys struct{ r *volumekey.Keyring }

func (k ringKeys) Keyring(context.Context) (*volumekey.Keyring, error) { return k.r, nil }

// keyLocator is a locator whose PVs record key IDs.
type keyLocator struct {
	locator
	keyIDs map[string]string
}

func (l keyLocator) HoldersOf(h string) ([]pvindex.Holder, error) {
	var out []pvindex.Holder
	for _, n := range l.pvs[h] {
		out = append(out, pvindex.Holder{PV: "pv-on-" + n, Node: n, KeyID: l.keyIDs[h]})
	}
	return out, nil
}

// TestCreateEncryptedVolume: a CreateVolume of an encrypted class reaches
// the node with the volume's key, its key ID and its wrapped key in the
// secrets (a caller's own key secrets are dropped); an answer that
// records another key ID is refused; a clone whose encryption is not its
// source's is INVALID_ARGUMENT naming the parameter; a bad value too.
func TestCreateEncryptedVolume(t *testing.T) {
	ring, err := volumekey.NewKeyring(map[string][]byte{"1": bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	as := newAgents()
	var list []*agent
	for _, a := range as {
		list = append(list, a)
	}
	ns, log := cluster(t, list...)
	pvs := map[string][]string{vid("vol-a"): {"node-a"}, vid("enc-a"): {"node-a"}}
	loc := keyLocator{locator: locator{pvs: pvs}, keyIDs: map[string]string{vid("enc-a"): volumekey.KeyIDFor("enc-a")}}
	r := New(Config{Nodes: ns, Volumes: loc, TopologyKey: topology.Key, Keys: ringKeys{ring}})
	enc := map[string]string{volume.ParamEncryption: volume.EncryptionLUKS2}
	create := func(name string, params map[string]string, src *csi.VolumeContentSource, secrets map[string]string) (*csi.CreateVolumeResponse, error) {
		return r.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: mountRWO,
			AccessibilityRequirements: strict("node-a"), Parameters: params, VolumeContentSource: src, Secrets: secrets})
	}

	resp, err := create("pvc-1", enc, nil, map[string]string{volume.SecretVolumeKey: "chosen by the caller", "other": "kept"})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetVolume().GetVolumeContext()[volume.ContextKeyID]; got != volumekey.KeyIDFor("pvc-1") {
		t.Errorf("key ID %q", got)
	}
	if got := log.of("Secrets"); len(got) != 1 || got[0] != "node-a "+volume.SecretVolumeKey+","+volume.SecretKeyID+","+volume.SecretWrappedKey+",other" {
		t.Errorf("secrets sent %v", got)
	}

	// A node that records another key ID is refused.
	as["node-a"].set(func() {
		as["node-a"].tamper = func(method string, resp any) {
			if c, ok := resp.(*csi.CreateVolumeResponse); ok {
				c.GetVolume().GetVolumeContext()[volume.ContextKeyID] = volumekey.KeyIDFor("pvc-other")
			}
		}
	})
	_, err = create("pvc-2", enc, nil, nil)
	wantStatus(t, err, codes.Internal, "node-a", volume.ContextKeyID)
	as["node-a"].set(func() { as["node-a"].tamper = nil })

	// Clones: an encrypted class from a plain source, and the reverse.
	_, err = create("pvc-3", enc, fromVolume(vid("vol-a")), nil)
	wantStatus(t, err, codes.InvalidArgument, volume.ParamEncryption, "not encrypted")
	_, err = create("pvc-4", nil, fromVolume(vid("enc-a")), nil)
	wantStatus(t, err, codes.InvalidArgument, volume.ParamEncryption, "is encrypted")
	// A bad value.
	_, err = create("pvc-5", map[string]string{volume.ParamEncryption: "aes"}, nil, nil)
	wantStatus(t, err, codes.InvalidArgument, volume.ParamEncryption, "luks2")
	// A plain volume gets no key, and a node that records one is refused.
	as["node-a"].set(func() {
		as["node-a"].tamper = func(method string, resp any) {
			if c, ok := resp.(*csi.CreateVolumeResponse); ok {
				c.GetVolume().GetVolumeContext()[volume.ContextKeyID] = volumekey.KeyIDFor("pvc-6")
			}
		}
	})
	_, err = create("pvc-6", nil, nil, nil)
	wantStatus(t, err, codes.Internal, volume.ContextKeyID)
}
