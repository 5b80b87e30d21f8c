package router

import (
	"context"
	"encoding/base64"
	"maps"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/controller/volumekey"
	"github.com/carve-csi/carve/internal/volume"
)

// VolumeKeys wraps new volume keys; *volumekey.Store is one.
type VolumeKeys interface {
	Keyring(ctx context.Context) (*volumekey.Keyring, error)
}

type holders interface {
	HoldersOf(handle string) ([]pvindex.Holder, error)
}

// keyCheck is what a CreateVolume answer must say of encryption.
type keyCheck struct {
	encrypted bool
	// keyID must be named by the volume context; "" for a restore, whose
	// header (the source's) names it.
	keyID string
}

// withVolumeKey prepares a CreateVolume: a new encrypted volume gets a key,
// wrapped under the newest KEK and sent with its ID in the request's
// secrets, which csi-provisioner never sees again; the node writes it into
// the LUKS2 header. A clone's encryption must be its source's (the PV's key
// ID); the node checks a restore's from its snapshot's tags. Key secrets
// that did not come from here are dropped.
func (s *Server) withVolumeKey(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeRequest, keyCheck, error) {
	enc, err := volume.ParseEncryption(req.GetParameters())
	if err != nil {
		return nil, keyCheck{}, status.Errorf(codes.InvalidArgument, "parameters: %v", err)
	}
	out := proto.CloneOf(req)
	maps.DeleteFunc(out.Secrets, func(k, _ string) bool { return volume.IsKeySecret(k) })
	kc := keyCheck{encrypted: enc}
	if id := req.GetVolumeContentSource().GetVolume().GetVolumeId(); id != "" {
		srcKey, known, err := s.sourceKeyID(id)
		if err != nil {
			return nil, keyCheck{}, err
		}
		if known && enc != (srcKey != "") {
			if enc {
				return nil, keyCheck{}, status.Errorf(codes.InvalidArgument, "parameters: %s is %q and the source volume %s is not encrypted: carve never encrypts a copy of plain data", volume.ParamEncryption, volume.EncryptionLUKS2, id)
			}
			return nil, keyCheck{}, status.Errorf(codes.InvalidArgument, "parameters: the source volume %s is encrypted (LUKS2): a clone of it needs %s %q", id, volume.ParamEncryption, volume.EncryptionLUKS2)
		}
		kc.keyID = srcKey
		return out, kc, nil
	}
	if !enc || req.GetVolumeContentSource() != nil {
		return out, kc, nil
	}
	if s.cfg.Keys == nil {
		return nil, keyCheck{}, status.Errorf(codes.FailedPrecondition, "parameters: %s %q: this carve controller holds no key-encryption key", volume.ParamEncryption, volume.EncryptionLUKS2)
	}
	ring, err := s.cfg.Keys.Keyring(ctx)
	if err != nil {
		return nil, keyCheck{}, status.Errorf(codes.Unavailable, "the key-encryption key of encrypted volumes cannot be read: %v; retry later", err)
	}
	key, err := volumekey.NewKey()
	if err != nil {
		return nil, keyCheck{}, status.Error(codes.Internal, err.Error())
	}
	defer clear(key)
	kc.keyID = volumekey.KeyIDFor(req.GetName())
	wrapped, err := ring.Wrap(kc.keyID, key)
	if err != nil {
		return nil, keyCheck{}, status.Error(codes.Internal, err.Error())
	}
	if out.Secrets == nil {
		out.Secrets = map[string]string{}
	}
	out.Secrets[volume.SecretVolumeKey] = base64.StdEncoding.EncodeToString(key)
	out.Secrets[volume.SecretKeyID] = kc.keyID
	out.Secrets[volume.SecretWrappedKey] = wrapped
	return out, kc, nil
}

// sourceKeyID is the key ID id's PVs record ("" plain); known is false when
// no PV holds it (the node decides).
func (s *Server) sourceKeyID(id string) (keyID string, known bool, err error) {
	h, ok := s.cfg.Volumes.(holders)
	if !ok || !isVolumeID(id) {
		return "", false, nil
	}
	hs, err := h.HoldersOf(id)
	if err != nil {
		return "", false, status.Errorf(codes.Unavailable, "volume_content_source: volume %s: its PersistentVolume is not known yet: %v; retry later", id, err)
	}
	if len(hs) == 0 {
		return "", false, nil
	}
	return hs[0].KeyID, true, nil
}

// checkKey refuses an answer whose volume context does not record the
// encryption asked for: the PV's key ID is the one its key is released for.
func (s *Server) checkKey(ctx context.Context, node string, kc keyCheck, resp *csi.CreateVolumeResponse) error {
	vc := resp.GetVolume().GetVolumeContext()
	got, has := vc[volume.ContextKeyID]
	switch {
	case !kc.encrypted && has:
		return s.refuse(ctx, node, "CreateVolume", refusedVolumeContext, "volume_context %s=%q for a volume that is not encrypted", volume.ContextKeyID, got)
	case kc.encrypted && (!volumekey.ValidKeyID(got) || kc.keyID != "" && got != kc.keyID):
		return s.refuse(ctx, node, "CreateVolume", refusedVolumeContext, "volume_context %s=%q, not the key ID %q of the volume's key", volume.ContextKeyID, got, kc.keyID)
	}
	return nil
}
