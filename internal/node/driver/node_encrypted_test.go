package driver

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/channel"
	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// fakeLUKS holds each device's header (its key and token) and the opened
// devices in memory.
type fakeLUKS struct {
	mu      sync.Mutex
	keys    map[string][]byte // device -> key
	tokens  map[string]luks.Token
	opened  map[string]string // mapper name -> device
	formats int
}

func newFakeLUKS() *fakeLUKS {
	return &fakeLUKS{keys: map[string][]byte{}, tokens: map[string]luks.Token{}, opened: map[string]string{}}
}

func (f *fakeLUKS) IsLUKS(_ context.Context, d string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.keys[d]
	return ok, nil
}

func (f *fakeLUKS) Format(_ context.Context, d string, key []byte, t luks.Token) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys[d], f.tokens[d] = bytes.Clone(key), t
	f.formats++
	return nil
}

func (f *fakeLUKS) ReadToken(_ context.Context, d string) (luks.Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tokens[d]
	if !ok {
		return t, luks.ErrNoToken
	}
	return t, nil
}

func (f *fakeLUKS) ReplaceToken(_ context.Context, d string, t luks.Token) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens[d] = t
	return nil
}

func (f *fakeLUKS) Open(_ context.Context, d, name string, key []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !bytes.Equal(f.keys[d], key) {
		return luks.ErrWrongKey
	}
	f.opened[name] = d
	return nil
}

func (f *fakeLUKS) Close(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.opened, name)
	return nil
}

func (f *fakeLUKS) Resize(context.Context, string, []byte) error { return nil }

func (f *fakeLUKS) Erase(_ context.Context, d string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, d)
	return nil
}

func (f *fakeLUKS) isOpen(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.opened[name]
	return ok
}

// answerKeys is the controller: answer gives the key or the error.
type answerKeys struct {
	answer func(volumeID, keyID, wrapped string) ([]byte, error)
}

func (k answerKeys) VolumeKey(_ context.Context, volumeID, keyID, wrapped string) ([]byte, string, error) {
	key, err := k.answer(volumeID, keyID, wrapped)
	rewrapped := ""
	if err == nil && wrapped == "carve1.1.x" {
		// As after a rotation: the same key under KEK 2.
		rewrapped = "carve1.2.y"
	}
	return key, rewrapped, err
}

// TestStageOfAnEncryptedVolumeNeverFormatsWithoutItsKey: an encrypted
// volume is formatted (mkfs) only on its opened device, after the
// controller released the key that opens it; a refusal, no controller, a
// wrong key, a missing header or token fail the stage naming the volume,
// and nothing is formatted. Unstage closes the device.
func TestStageOfAnEncryptedVolumeNeverFormatsWithoutItsKey(t *testing.T) {
	fx := newNodeFixture(t)
	fx.setLV(fx.id, func(lv *lvm.LogicalVolume) { lv.Tags = append(lv.Tags, volume.TagEncrypted) })
	if err := fx.view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	crypt := newFakeLUKS()
	key := bytes.Repeat([]byte{7}, 32)
	tok := luks.Token{KeyID: "0123456789abcdef0123456789abcdef", Wrapped: "carve1.1.x"}
	vol, _ := volume.ParseID(fx.id)
	name, mapper := fx.ns.mapperOf(vol)
	header := true
	fx.ns.hasLUKSHeader = func(string) (bool, error) { return header, nil }
	fx.ns.isDeviceNode = func(p string) bool { return p == fx.device || p == mapper && crypt.isOpen(name) }
	fx.tools.SetSize(mapper, 1<<30)
	var answer func(volumeID, keyID, wrapped string) ([]byte, error)
	fx.ns.cfg.LUKS, fx.ns.cfg.Keys = crypt, answerKeys{func(v, k, w string) ([]byte, error) { return answer(v, k, w) }}
	stage := func() error {
		_, err := fx.ns.NodeStageVolume(context.Background(), fx.stageReq(mountCap("ext4", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)))
		return err
	}
	noMkfs := func(what string) {
		t.Helper()
		if n := len(fx.tools.Ran("mkfs.ext4")); n != 0 {
			t.Fatalf("%s: mkfs ran %d times", what, n)
		}
	}

	// A raw-block publish before the stage would hand out ciphertext.
	if _, err := fx.ns.NodePublishVolume(context.Background(), fx.publishReq(blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), false)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("publish of an encrypted volume not open: %v", err)
	}
	// No header on a device whose LV says it is encrypted.
	header = false
	if err := stage(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("no header: %v", err)
	}
	noMkfs("no header")
	header = true
	// A header without carve's token.
	if err := stage(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("no token: %v", err)
	}
	noMkfs("no token")
	if err := crypt.Format(context.Background(), fx.device, key, tok); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		answer func(v, k, w string) ([]byte, error)
		code   codes.Code
		result string
	}{
		{"refused", func(string, string, string) ([]byte, error) {
			return nil, &channel.KeyRefusedError{Reason: "not yours"}
		}, codes.FailedPrecondition, "refused"},
		{"no controller", func(string, string, string) ([]byte, error) { return nil, channel.ErrNoController }, codes.Unavailable, "unavailable"},
		{"wrong key", func(string, string, string) ([]byte, error) { return bytes.Repeat([]byte{8}, 32), nil }, codes.FailedPrecondition, "wrong_key"},
	} {
		answer = c.answer
		err := stage()
		if status.Code(err) != c.code {
			t.Fatalf("%s: stage = %v, want %s", c.name, err, c.code)
		}
		if !strings.Contains(status.Convert(err).Message(), fx.id) {
			t.Errorf("%s: %q does not name the volume", c.name, err)
		}
		noMkfs(c.name)
		if got := testutil.ToFloat64(fx.ns.cfg.Metrics.LUKSOpens(c.result)); got != 1 {
			t.Errorf("%s: carve_encrypted_volume_opens_total{result=%s} = %v, want 1", c.name, c.result, got)
		}
	}
	// The controller's key: asked with the header's key ID and wrapped key.
	answer = func(v, k, w string) ([]byte, error) {
		if v != fx.id || k != tok.KeyID || w != tok.Wrapped && w != "carve1.2.y" {
			return nil, &channel.KeyRefusedError{Reason: "asked " + v + " " + k + " " + w}
		}
		return bytes.Clone(key), nil
	}
	if err := stage(); err != nil {
		t.Fatalf("stage with the key: %v", err)
	}
	mk := fx.tools.Ran("mkfs.ext4")
	if len(mk) != 1 || mk[0][len(mk[0])-1] != mapper {
		t.Fatalf("mkfs ran %v, want once on %s", mk, mapper)
	}
	if mp := fx.mountAt(fx.staging); mp == nil || mp.Device != mapper {
		t.Fatalf("staged %+v, want %s mounted", mp, mapper)
	}
	if _, err := fx.ns.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: fx.id, StagingTargetPath: fx.staging}); err != nil {
		t.Fatal(err)
	}
	if crypt.isOpen(name) {
		t.Error("unstage left the device open")
	}
	// The open after a rotation wrote the rewrapped key into the header.
	if got, _ := crypt.ReadToken(context.Background(), fx.device); got.Wrapped != "carve1.2.y" || got.KeyID != tok.KeyID {
		t.Errorf("token after the open: %+v, want the key rewrapped under KEK 2", got)
	}
}
