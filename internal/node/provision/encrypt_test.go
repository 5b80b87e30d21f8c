package provision

import (
	"context"
	"testing"

	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/volume"
)

// noLUKS is a cryptsetup the tests below must never reach.
type noLUKS struct{ luks.Interface }

// TestRestoreRefusesMixedEncryption: a restore or clone of an encrypted
// volume into a plain one, or of a plain one into an encrypted one, is
// ErrInvalid naming the parameter, and nothing is made.
func TestRestoreRefusesMixedEncryption(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	enc := l.mustVolume(t, "pvc-enc", gib, "fast")
	plain := l.mustVolume(t, "pvc-plain", gib, "fast")
	l.lvm.Mu.Lock()
	l.lvm.LVs[enc].Tags = append(l.lvm.LVs[enc].Tags, volume.TagEncrypted)
	l.lvm.Mu.Unlock()
	l.restart(t)
	l.p.cfg.LUKS = noLUKS{}
	encSnap := l.mustSnapshot(t, "snap-enc", enc)
	if !volume.Encrypted(encSnap.Tags) {
		t.Fatalf("the snapshot of an encrypted volume is not tagged encrypted: %v", encSnap.Tags)
	}
	plainSnap := l.mustSnapshot(t, "snap-plain", plain)

	for _, c := range []struct {
		name      string
		src       *Source
		encrypted bool
		says      string
	}{
		{"encrypted snapshot into a plain volume", snapshotSource(encSnap), false, "is encrypted"},
		{"encrypted clone into a plain volume", &Source{ID: enc}, false, "is encrypted"},
		{"plain snapshot into an encrypted volume", snapshotSource(plainSnap), true, "is not encrypted"},
		{"plain clone into an encrypted volume", &Source{ID: plain}, true, "is not encrypted"},
	} {
		req := l.request(t, "pvc-new", gib, "fast", c.src)
		if c.encrypted {
			req.Encryption = &Encryption{}
		}
		_, err := l.p.Create(ctx, req)
		wantKind(t, err, ErrInvalid, volume.ParamEncryption, c.says)
		if _, made := l.lvm.LVs["vg1/"+volume.LVNameFor("pvc-new")]; made {
			t.Fatalf("%s: an LV was made", c.name)
		}
	}
}
