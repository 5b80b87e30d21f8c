package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/directio"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// Encryption is an encrypted volume's part of a Request.
type Encryption struct {
	// Key is nil for a restore or clone: the header comes with the data.
	Key []byte
	// Token is the header's key ID and wrapped key.
	Token luks.Token
}

var luksMagic = []byte{'L', 'U', 'K', 'S', 0xba, 0xbe}

// HasLUKSHeader reads the magic in-process (no cryptsetup needed) with
// direct I/O: a page cached before luksFormat or luksErase wrote the start
// of the device would answer for the device as it was, and delete would skip
// the erase.
func HasLUKSHeader(path string) (bool, error) {
	f, err := directio.Open(path, os.O_RDONLY, true)
	if err != nil {
		return false, err
	}
	defer f.Close() //nolint:errcheck // read-only
	b := directio.Aligned(directio.Align)
	if _, err := io.ReadAtLeast(f, b, len(luksMagic)); err != nil {
		return false, fmt.Errorf("reading the start of %s: %w", path, err)
	}
	return bytes.Equal(b[:len(luksMagic)], luksMagic), nil
}

func encryptionTags(r *Request) []string {
	if r.Encryption == nil {
		return nil
	}
	return []string{volume.TagEncrypted}
}

// checkSourceEncryption refuses a restore or clone of other encryption.
func checkSourceEncryption(r *Request, src *contentSource) error {
	if src == nil || src.remote != nil {
		return nil
	}
	if enc := volume.Encrypted(src.lv.Tags); enc != (r.Encryption != nil) {
		return encryptionMismatch(r, src.id, enc)
	}
	return nil
}

func encryptionMismatch(r *Request, source string, sourceEncrypted bool) error {
	if sourceEncrypted {
		return errorf(ErrInvalid, "parameters: the source %s of volume %q is encrypted (LUKS2) and %s is not %q: a restore or clone of an encrypted volume must be encrypted too",
			source, r.Name, volume.ParamEncryption, volume.EncryptionLUKS2)
	}
	return errorf(ErrInvalid, "parameters: %s is %q and the source %s of volume %q is not encrypted: carve encrypts new volumes only, never a copy of plain data",
		volume.ParamEncryption, volume.EncryptionLUKS2, source, r.Name)
}

// ensureLUKS gives a new volume its LUKS2 header and token (again if a crash
// left a header without its token: such a volume was never handed out);
// one with both is kept; a restore or clone must hold its source's header.
func (p *Provisioner) ensureLUKS(ctx context.Context, lv *lvm.LogicalVolume, r *Request, phase string) error {
	dev := p.devicePath(lv)
	has, err := p.cfg.HasLUKSHeader(dev)
	if err != nil {
		return errorf(ErrInternal, "volume %q: reading the start of %s: %v", r.Name, dev, err)
	}
	if r.Source != nil {
		if !has {
			return encryptionMismatch(r, r.Source.ID, false)
		}
		tok, err := p.cfg.LUKS.ReadToken(ctx, dev)
		if err != nil {
			return errorf(ErrRefused, "volume %q: its source's LUKS2 header holds no key of carve's: %v", r.Name, err)
		}
		r.Encryption.Token = tok
		return nil
	}
	if has {
		tok, err := p.cfg.LUKS.ReadToken(ctx, dev)
		switch {
		case err == nil:
			r.Encryption.Token = tok
			return nil
		case !errors.Is(err, luks.ErrNoToken):
			return wrap(err, "reading the LUKS2 token of "+dev)
		}
		klog.FromContext(ctx).Info("The new volume's LUKS2 header has no token (a create cut short); formatting it again")
	}
	if len(r.Encryption.Key) == 0 {
		return errorf(ErrInvalid, "volume %q: an encrypted volume needs its key from carve controller (secrets %s)", r.Name, volume.SecretVolumeKey)
	}
	start := time.Now()
	err = p.cfg.LUKS.Format(ctx, dev, r.Encryption.Key, r.Encryption.Token)
	p.cfg.Metrics.ObserveStep(phase, metrics.StepLUKSFormat, r.Class.Name, time.Since(start), err)
	if err != nil {
		return wrap(err, "writing the LUKS2 header of "+dev)
	}
	// The header is the only way to the data: durable before answering.
	if _, err := p.cfg.Eraser.Erase(ctx, dev, erase.Flush); err != nil {
		return errorf(ErrInternal, "volume %q: flushing its LUKS2 header to the disk: %v", r.Name, err)
	}
	klog.FromContext(ctx).Info("Encrypted the new volume", "keyID", r.Encryption.Token.KeyID)
	return nil
}

// cryptoErase destroys the keyslots: the data is unreadable, no zeroing.
func (p *Provisioner) cryptoErase(ctx context.Context, lv *lvm.LogicalVolume, id, class string) error {
	if p.cfg.LUKS == nil {
		return errorf(ErrUnavailable, "volume %s is encrypted and this node runs without cryptsetup; it cannot be crypto-erased here", id)
	}
	cur, err := p.cfg.LVM.GetLV(ctx, lv.VolumeGroup, lv.Name)
	if err != nil {
		return wrap(err, "reading "+id)
	}
	if cur.Attr.Open {
		return errorf(ErrRefused, "volume %s is in use (open or mounted); unstage it first", id)
	}
	if !cur.Attr.Active {
		if cur, err = p.cfg.LVM.ActivateLV(ctx, lv.VolumeGroup, lv.Name); err != nil {
			return wrap(err, "activating "+id+" to erase its LUKS2 header")
		}
	}
	dev := p.devicePath(cur)
	has, err := p.cfg.HasLUKSHeader(dev)
	if err != nil {
		return errorf(ErrInternal, "volume %s: reading the start of %s: %v", id, dev, err)
	}
	if !has {
		return nil
	}
	start := time.Now()
	err = p.cfg.LUKS.Erase(ctx, dev)
	took := time.Since(start)
	p.cfg.Metrics.ObserveStep(metrics.PhaseDelete, metrics.StepCryptoErase, classLabel(class), took, err)
	if err != nil {
		return wrap(err, fmt.Sprintf("crypto-erasing %s (luksErase)", id))
	}
	klog.FromContext(ctx).Info("Crypto-erased the volume: its LUKS2 keyslots are destroyed", "volumeID", id, "took", took)
	return nil
}
