package volume

import (
	"fmt"
	"slices"
	"strings"
)

// ParamEncryption is the StorageClass parameter that asks for encrypted
// volumes; CreateVolume copies it into the volume context.
const ParamEncryption = "carve.dev/encryption"

// The values of ParamEncryption.
const (
	// EncryptionLUKS2 makes each volume a LUKS2 device with its own key, which
	// only the controller unwraps (docs/architecture.md, "Encrypted volumes").
	EncryptionLUKS2 = "luks2"
	// EncryptionNone is the default: a plain LV.
	EncryptionNone = "none"
)

// EncryptionValues are the values ParamEncryption takes.
var EncryptionValues = []string{EncryptionLUKS2, EncryptionNone}

// ContextKeyID is the volume context key of an encrypted volume's key ID,
// the one its key is released for.
const ContextKeyID = "carve.dev/encryption-key-id"

// TagEncrypted marks an encrypted LV: staged only through dm-crypt, never
// formatted as it is.
const TagEncrypted = "carve.dev/encryption=luks2"

// Encrypted tells whether an LV's tags mark it encrypted.
func Encrypted(tags []string) bool { return slices.Contains(tags, TagEncrypted) }

// ParseEncryption reads ParamEncryption: true for luks2, false when absent
// or none.
func ParseEncryption(params map[string]string) (bool, error) {
	v, ok := params[ParamEncryption]
	switch {
	case !ok || v == EncryptionNone:
		return false, nil
	case v == EncryptionLUKS2:
		return true, nil
	}
	return false, fmt.Errorf("%s: %q is not an encryption; allowed: %s", ParamEncryption, v, strings.Join(EncryptionValues, ", "))
}

// MapperName is the dm name of an encrypted volume's opened device, unique
// per LV name on the node.
func MapperName(lv string) string { return "carve-luks-" + strings.TrimPrefix(lv, "carve-") }

// The CreateVolume secrets of a new encrypted volume, never stored: the
// node writes the wrapped key into the LUKS2 header and the key into its
// keyslot only.
const (
	// SecretVolumeKey is the volume's key, base64 (standard encoding).
	SecretVolumeKey = "carve.dev/volume-key" //nolint:gosec // G101: a secret's name, not a credential
	// SecretKeyID is the key ID the controller records for the volume.
	SecretKeyID = "carve.dev/volume-key-id" //nolint:gosec // G101: a secret's name, not a credential
	// SecretWrappedKey is the key wrapped under the controller's KEK.
	SecretWrappedKey = "carve.dev/volume-key-wrapped" //nolint:gosec // G101: a secret's name, not a credential
)

// IsKeySecret tells whether a CreateVolume secret is one of carve's key
// secrets, which only the controller may set.
func IsKeySecret(k string) bool {
	return k == SecretVolumeKey || k == SecretKeyID || k == SecretWrappedKey
}
