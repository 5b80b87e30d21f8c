package driver

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/capability"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/volume"
)

// paramPassThroughPrefix marks external-provisioner's extra metadata; the
// claim's are recorded in the LV's tags.
const paramPassThroughPrefix = "csi.storage.k8s.io/" //nolint:gosec // G101: a parameter prefix, not a credential

func checkVolumeName(name string) error {
	switch {
	case name == "":
		return status.Error(codes.InvalidArgument, "name: must be set")
	case len(name) > volume.MaxNameLength:
		return status.Errorf(codes.InvalidArgument, "name: %d bytes long; at most %d are allowed", len(name), volume.MaxNameLength)
	}
	return nil
}

// checkCapabilities validates capabilities and returns the mount fsType
// ("" when all are block).
func checkCapabilities(caps []*csi.VolumeCapability, fsTypes []string) (string, error) {
	if len(caps) == 0 {
		return "", status.Error(codes.InvalidArgument, "volume_capabilities: at least one capability must be given")
	}
	fsType := ""
	for i, c := range caps {
		a, err := capability.Parse(c, fsTypes)
		if err != nil {
			return "", capabilityStatus(fmt.Sprintf("volume_capabilities[%d]", i), err)
		}
		if a.Block {
			continue
		}
		if fsType != "" && a.FSType != fsType {
			return "", status.Errorf(codes.InvalidArgument, "volume_capabilities[%d]: fs_type %q conflicts with %q of another capability", i, a.FSType, fsType)
		}
		fsType = a.FSType
	}
	return fsType, nil
}

// capabilityStatus: InvalidArgument, or ResourceExhausted for a filesystem
// another node may make.
func capabilityStatus(field string, err error) error {
	var ce *capability.Error
	if errors.As(err, &ce) {
		if errors.Is(err, capability.ErrFilesystemElsewhere) {
			return status.Error(codes.ResourceExhausted, ce.In(field))
		}
		return status.Error(codes.InvalidArgument, ce.In(field))
	}
	return status.Errorf(codes.InvalidArgument, "%s: %v", field, err)
}

// classFromParameters picks the named device class; one this node lacks is
// provision.ErrElsewhere, so the scheduler tries another node.
func classFromParameters(params map[string]string, cfg *deviceclass.Config, node string) (*deviceclass.DeviceClass, error) {
	name := ""
	for k, v := range params {
		switch {
		case k == volume.ParamDeviceClass:
			name = v
		case strings.HasPrefix(k, paramPassThroughPrefix), volume.IsIOLimitParam(k), k == volume.ParamEncryption:
		default:
			return nil, status.Errorf(codes.InvalidArgument, "parameters: unknown key %q; carve accepts %q, %q, %s and keys starting with %q",
				k, volume.ParamDeviceClass, volume.ParamEncryption, strings.Join(volume.IOLimitParams(), ", "), paramPassThroughPrefix)
		}
	}
	if name != "" && !deviceclass.IsClassName(name) {
		return nil, status.Errorf(codes.InvalidArgument, "parameters: %s %q is not a device class name (a DNS-1123 label)", volume.ParamDeviceClass, name)
	}
	d, ok := cfg.Class(name)
	if !ok {
		if name == "" {
			return nil, status.Errorf(codes.InvalidArgument, "parameters: %s is not set and node %s has no default device class; its classes: %s", volume.ParamDeviceClass, node, strings.Join(cfg.Names(), ", "))
		}
		return nil, provision.Errorf(provision.ErrElsewhere, "parameters: device class %q is not configured on node %s; its classes: %s", name, node, strings.Join(cfg.Names(), ", "))
	}
	return d, nil
}

// ioLimitsFromRequest reads the StorageClass's IO limits, with the
// VolumeAttributesClass's mutable parameters over them.
func ioLimitsFromRequest(params, mutable map[string]string) (volume.IOLimits, error) {
	l, err := volume.ParseIOLimits(params, volume.IOLimits{}, true)
	if err != nil {
		return l, status.Errorf(codes.InvalidArgument, "parameters: %v", err)
	}
	if l, err = volume.ParseIOLimits(mutable, l, false); err != nil {
		return l, status.Errorf(codes.InvalidArgument, "mutable_parameters: %v", err)
	}
	return l, nil
}

// encryptionFromRequest is nil for a plain volume; else the key, key ID and
// wrapped key from carve controller's secrets (none with a source).
func encryptionFromRequest(req *csi.CreateVolumeRequest) (*provision.Encryption, error) {
	enc, err := volume.ParseEncryption(req.GetParameters())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "parameters: %v", err)
	}
	if !enc {
		return nil, nil
	}
	if req.GetVolumeContentSource() != nil {
		return &provision.Encryption{}, nil
	}
	sec := req.GetSecrets()
	key, err := base64.StdEncoding.DecodeString(sec[volume.SecretVolumeKey])
	if err != nil || len(key) != 32 || sec[volume.SecretKeyID] == "" || sec[volume.SecretWrappedKey] == "" {
		return nil, status.Errorf(codes.InvalidArgument, "secrets: an encrypted volume (%s %q) needs its key from carve controller (%s, %s, %s); "+
			"the node agent takes CreateVolume only from carve controller", volume.ParamEncryption, volume.EncryptionLUKS2, volume.SecretVolumeKey, volume.SecretKeyID, volume.SecretWrappedKey)
	}
	return &provision.Encryption{Key: key, Token: luks.Token{KeyID: sec[volume.SecretKeyID], Wrapped: sec[volume.SecretWrappedKey]}}, nil
}
