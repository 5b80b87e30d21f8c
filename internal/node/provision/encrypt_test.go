package provision

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/erase"
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

// eraseLog is a cryptsetup that records erasures.
type eraseLog struct {
	luks.Interface
	erased []string
}

func (e *eraseLog) Erase(_ context.Context, dev string) error {
	e.erased = append(e.erased, dev)
	return nil
}

// TestDeleteCryptoErases: deleting an encrypted volume destroys its
// LUKS2 keyslots before lvremove, with no zeroing; an encrypted volume
// that is open (staged) is refused and its header left alone; one whose
// header was never written is removed without an erase.
func TestDeleteCryptoErases(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	id := l.mustVolume(t, "pvc-enc", gib, "fast")
	l.lvm.Mu.Lock()
	l.lvm.LVs[id].Tags = append(l.lvm.LVs[id].Tags, volume.TagEncrypted)
	l.lvm.LVs[id].Attr.Open = true
	l.lvm.Mu.Unlock()
	l.restart(t)
	crypt := &eraseLog{}
	header := true
	l.p.cfg.LUKS = crypt
	l.p.cfg.HasLUKSHeader = func(string) (bool, error) { return header, nil }
	vg, lv, _ := volume.ParseVolumeID(id)
	erasedBefore := len(l.eraser.Erasures())

	_, err := l.p.Delete(ctx, vg, lv, id)
	wantKind(t, err, ErrRefused, "in use")
	if len(crypt.erased) != 0 {
		t.Fatalf("the header of an open volume was erased: %v", crypt.erased)
	}
	l.lvm.Mu.Lock()
	l.lvm.LVs[id].Attr.Open = false
	l.lvm.Mu.Unlock()
	if _, err := l.p.Delete(ctx, vg, lv, id); err != nil {
		t.Fatal(err)
	}
	if len(crypt.erased) != 1 || crypt.erased[0] != "/dev/"+id {
		t.Fatalf("erased %v, want /dev/%s once", crypt.erased, id)
	}
	if _, ok := l.lvm.LVs[id]; ok {
		t.Fatal("the LV is still there")
	}
	for _, c := range l.eraser.Erasures()[erasedBefore:] {
		if c.Method != erase.Flush {
			t.Errorf("delete of an encrypted volume zeroed: %+v", c)
		}
	}

	// A header never written (a create cut short): removed, not erased.
	id2 := l.mustVolume(t, "pvc-enc2", gib, "fast")
	l.lvm.Mu.Lock()
	l.lvm.LVs[id2].Tags = append(l.lvm.LVs[id2].Tags, volume.TagEncrypted)
	l.lvm.Mu.Unlock()
	header = false
	vg, lv, _ = volume.ParseVolumeID(id2)
	if _, err := l.p.Delete(ctx, vg, lv, id2); err != nil {
		t.Fatal(err)
	}
	if len(crypt.erased) != 1 {
		t.Errorf("erased %v", crypt.erased)
	}
}

// TestHasLUKSHeader: the LUKS magic at the start of a device says
// encrypted, anything else not, and a device too short to hold it is an
// error rather than "not encrypted" (delete would skip the crypto-erase).
func TestHasLUKSHeader(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name    string
		start   []byte
		want    bool
		wantErr bool
	}{
		{"luks2", append([]byte("LUKS\xba\xbe\x00\x02"), make([]byte, 8184)...), true, false},
		{"ext4 or zeros", make([]byte, 8192), false, false},
		{"magic one byte off", append([]byte("LUKS\xba\xbf\x00\x02"), make([]byte, 8184)...), false, false},
		{"shorter than the magic", []byte("LUKS"), false, true},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
		if err := os.WriteFile(path, c.start, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := HasLUKSHeader(path)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("%s: HasLUKSHeader = %v, %v; want %v (error: %v)", c.name, got, err, c.want, c.wantErr)
		}
	}
}
