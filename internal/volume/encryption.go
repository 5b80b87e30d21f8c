package volume

import (
	"fmt"
	"slices"
	"strings"
)

// ParamEncryption is the StorageClass parameter asking for encrypted volumes.
const ParamEncryption = "carve.dev/encryption"

// The values of ParamEncryption.
const (
	// EncryptionLUKS2 gives each volume a LUKS2 device with a key only the controller unwraps.
	EncryptionLUKS2 = "luks2"
	// EncryptionNone is the default: a plain LV.
	EncryptionNone = "none"
)

// EncryptionValues are the values ParamEncryption takes.
var EncryptionValues = []string{EncryptionLUKS2, EncryptionNone}

// ContextKeyID is the volume context key of the key ID the volume's key is released for.
const ContextKeyID = "carve.dev/encryption-key-id"

// TagEncrypted marks an encrypted LV: staged only through dm-crypt, never formatted bare.
const TagEncrypted = "carve.dev/encryption=luks2"

// Encrypted tells whether an LV's tags mark it encrypted.
func Encrypted(tags []string) bool { return slices.Contains(tags, TagEncrypted) }

// ParseEncryption reads ParamEncryption: true for luks2.
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

// MapperName is the dm name of an encrypted volume's opened device.
func MapperName(lv string) string { return "carve-luks-" + strings.TrimPrefix(lv, "carve-") }

// The CreateVolume secrets of a new encrypted volume; the node stores only the wrapped key.
const (
	// SecretVolumeKey is the volume's key, base64 (standard encoding).
	SecretVolumeKey = "carve.dev/volume-key" //nolint:gosec // G101: a secret's name, not a credential
	// SecretKeyID is the key ID the controller records for the volume.
	SecretKeyID = "carve.dev/volume-key-id" //nolint:gosec // G101: a secret's name, not a credential
	// SecretWrappedKey is the key wrapped under the controller's KEK.
	SecretWrappedKey = "carve.dev/volume-key-wrapped" //nolint:gosec // G101: a secret's name, not a credential
)

// IsKeySecret tells carve's key secrets, which only the controller may set.
func IsKeySecret(k string) bool {
	return k == SecretVolumeKey || k == SecretKeyID || k == SecretWrappedKey
}
