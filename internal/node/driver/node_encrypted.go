// Encrypted volumes: NodeStageVolume opens the LUKS2 device with the key
// carve controller releases, later calls use the opened device, and
// NodeUnstageVolume closes it.

package driver

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/channel"
	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/volume"
)

// VolumeKeys asks carve controller for an encrypted volume's key. Errors:
// channel.ErrNoController, *channel.KeyRefusedError.
type VolumeKeys interface {
	// VolumeKey returns the key, and the key rewrapped under the newest KEK
	// when the header's is older ("" otherwise).
	VolumeKey(ctx context.Context, volumeID, keyID, wrapped string) (key []byte, rewrapped string, err error)
}

func (n *NodeServer) mapperOf(vol volume.ID) (name, path string) {
	name = volume.MapperName(vol.LV)
	return name, luks.MapperPath(n.cfg.DevDir, name)
}

func (n *NodeServer) openedDevice(vol volume.ID, device string) string {
	if _, mapper := n.mapperOf(vol); n.isDeviceNode(mapper) {
		return mapper
	}
	return device
}

// encrypted tells whether vol is encrypted, by its LV's tag. A LUKS device
// whose LV lost its tag is still never formatted: the signature check
// refuses crypto_LUKS.
func (n *NodeServer) encrypted(ctx context.Context, vol volume.ID) (bool, error) {
	if n.cfg.View != nil {
		if lv, ok := n.cfg.View.LV(vol.VG, vol.LV); ok {
			return volume.Encrypted(lv.Tags), nil
		}
	}
	lv, err := n.cfg.LVM.GetLV(ctx, vol.VG, vol.LV)
	if err != nil {
		return false, lookupStatus(vol, err)
	}
	return volume.Encrypted(lv.Tags), nil
}

// openEncrypted returns the device a stage goes on with: device, or the
// opened LUKS device. Nothing here formats.
func (n *NodeServer) openEncrypted(ctx context.Context, op *metrics.Op, vol volume.ID, device string) (string, error) {
	name, mapper := n.mapperOf(vol)
	if device == mapper {
		return device, nil // open already (activeDevice found it)
	}
	enc, err := n.encrypted(ctx, vol)
	if err != nil || !enc {
		return device, err
	}
	if n.isDeviceNode(mapper) {
		return mapper, nil
	}
	result := "error"
	start := time.Now()
	err = n.open(ctx, vol, device, name, &result)
	n.cfg.Metrics.CountLUKSOpen(result)
	op.Took(metrics.StepLUKSOpen, time.Since(start), err)
	if err != nil {
		return "", err
	}
	klog.FromContext(ctx).Info("Opened the encrypted volume", "volumeID", vol.String(), "device", mapper)
	return mapper, nil
}

func (n *NodeServer) open(ctx context.Context, vol volume.ID, device, name string, result *string) error {
	if n.cfg.LUKS == nil || n.cfg.Keys == nil {
		*result = "unavailable"
		return status.Errorf(codes.FailedPrecondition, "volume %q is encrypted, and this node agent opens no encrypted volumes (no cryptsetup, or no node channel to carve controller)", vol)
	}
	has, err := n.hasLUKSHeader(device)
	if err != nil {
		return status.Errorf(codes.Internal, "volume %q: reading the start of %s: %v", vol, device, err)
	}
	if !has {
		*result = "no_header"
		return status.Errorf(codes.FailedPrecondition, "volume %q is encrypted (its LV carries %s), but its device %s holds no LUKS2 header: the header is lost or overwritten, "+
			"so its data cannot be decrypted; carve does not format it", vol, volume.TagEncrypted, device)
	}
	tok, err := n.cfg.LUKS.ReadToken(ctx, device)
	if errors.Is(err, luks.ErrNoToken) {
		*result = "no_header"
		return status.Errorf(codes.FailedPrecondition, "volume %q: its LUKS2 header holds no key of carve's (%v); carve does not format it", vol, err)
	}
	if err != nil {
		return status.Errorf(codes.Internal, "volume %q: reading its LUKS2 token: %v", vol, err)
	}
	key, rewrapped, err := n.cfg.Keys.VolumeKey(ctx, vol.String(), tok.KeyID, tok.Wrapped)
	var refused *channel.KeyRefusedError
	switch {
	case errors.As(err, &refused):
		*result = "refused"
		return status.Errorf(codes.FailedPrecondition, "volume %q: %v; carve does not format it", vol, err)
	case errors.Is(err, channel.ErrNoController):
		*result = "unavailable"
		return status.Errorf(codes.Unavailable, "volume %q is encrypted and its key comes from carve controller: %v; retry later", vol, err)
	case err != nil:
		return status.Errorf(codes.Unavailable, "volume %q: asking carve controller for its key: %v", vol, err)
	}
	// cryptsetup holds the volume key in the kernel from here on.
	defer clear(key)
	err = n.cfg.LUKS.Open(ctx, device, name, key)
	switch {
	case errors.Is(err, luks.ErrWrongKey):
		*result = "wrong_key"
		return status.Errorf(codes.FailedPrecondition, "volume %q: the key carve controller released for key ID %s opens no keyslot of its LUKS2 header (a wrong or altered key, or a header that was crypto-erased); carve does not format it",
			vol, tok.KeyID)
	case err != nil:
		return status.Errorf(codes.Internal, "volume %q: opening its LUKS2 device: %v", vol, err)
	}
	*result = "opened"
	if rewrapped != "" {
		// After a KEK rotation the header gets the key under the newest KEK so the
		// old one can go; a failure keeps the old token, which still opens.
		if err := n.cfg.LUKS.ReplaceToken(ctx, device, luks.Token{KeyID: tok.KeyID, Wrapped: rewrapped}); err != nil {
			klog.FromContext(ctx).Error(err, "Writing the key wrapped under the newest key-encryption key into the volume's header; the old one stays", "volumeID", vol.String())
		} else {
			klog.FromContext(ctx).Info("Wrote the volume's key, wrapped under the newest key-encryption key, into its header", "volumeID", vol.String())
		}
	}
	return nil
}

// checkOpened refuses to publish an encrypted volume that is not open: a
// pod must never get its ciphertext as a raw block device.
func (n *NodeServer) checkOpened(ctx context.Context, vol volume.ID, device string) error {
	if _, mapper := n.mapperOf(vol); device == mapper {
		return nil
	}
	enc, err := n.encrypted(ctx, vol)
	if err != nil || !enc {
		return err
	}
	return status.Errorf(codes.FailedPrecondition, "volume %q is encrypted and not open on this node: NodeStageVolume opens it before it is published", vol)
}

// closeEncrypted closes vol's LUKS device, so no key stays after unstage.
func (n *NodeServer) closeEncrypted(ctx context.Context, vol volume.ID) error {
	name, mapper := n.mapperOf(vol)
	if !n.isDeviceNode(mapper) {
		return nil
	}
	if n.cfg.LUKS == nil {
		return status.Errorf(codes.Internal, "volume %q: its encrypted device %s is open and this node has no cryptsetup to close it", vol, mapper)
	}
	if err := n.cfg.LUKS.Close(ctx, name); err != nil {
		return status.Errorf(codes.Internal, "volume %q: closing its encrypted device %s: %v", vol, mapper, err)
	}
	klog.FromContext(ctx).Info("Closed the encrypted volume", "volumeID", vol.String(), "device", mapper)
	return nil
}

// resizeEncrypted grows vol's opened LUKS device to its LV; one not open
// sees the size at its next open.
func (n *NodeServer) resizeEncrypted(ctx context.Context, vol volume.ID, device string) error {
	name, mapper := n.mapperOf(vol)
	if !n.isDeviceNode(mapper) || n.cfg.LUKS == nil {
		return nil
	}
	err := n.cfg.LUKS.Resize(ctx, name, nil)
	if err == nil || n.cfg.Keys == nil {
		return resizeStatus(vol, mapper, err)
	}
	klog.FromContext(ctx).V(2).Info("Growing the encrypted device without its key failed; asking carve controller for it", "volumeID", vol.String(), "err", err.Error())
	tok, terr := n.cfg.LUKS.ReadToken(ctx, device)
	if terr != nil {
		return resizeStatus(vol, mapper, errors.Join(err, terr))
	}
	key, _, kerr := n.cfg.Keys.VolumeKey(ctx, vol.String(), tok.KeyID, tok.Wrapped)
	if kerr != nil {
		return status.Errorf(codes.Unavailable, "volume %q: growing its encrypted device %s needs its key, which carve controller did not give: %v", vol, mapper, kerr)
	}
	defer clear(key)
	return resizeStatus(vol, mapper, n.cfg.LUKS.Resize(ctx, name, key))
}

func resizeStatus(vol volume.ID, mapper string, err error) error {
	if err != nil {
		return status.Errorf(codes.Internal, "volume %q: growing its encrypted device %s: %v", vol, mapper, err)
	}
	return nil
}
