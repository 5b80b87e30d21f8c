package capability

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

func mountCapability(fsType string, mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func TestParse(t *testing.T) {
	const (
		sw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
		ro = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	)
	fsTypes := []string{"ext4", "xfs"}
	for _, tc := range []struct {
		name string
		cap  *csi.VolumeCapability
		want Access
		msg  string // the message In("volume_capability") holds; "" for accepted
		// elsewhere: the error wraps ErrFilesystemElsewhere (another
		// node may make the filesystem).
		elsewhere bool
	}{
		{name: "default filesystem", cap: mountCapability("", sw), want: Access{FSType: "ext4", Mode: sw}},
		{name: "xfs with flags", cap: mountCapability("xfs", sw, "noatime", "discard"), want: Access{FSType: "xfs", Mode: sw, Flags: []string{"noatime", "discard"}}},
		{name: "reader only", cap: mountCapability("ext4", ro, "ro"), want: Access{FSType: "ext4", Mode: ro, ReadOnly: true, Flags: []string{"ro"}}},
		{name: "block", cap: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: sw}}, want: Access{Block: true, Mode: sw}},
		{name: "nil", cap: nil, msg: "volume_capability is required"},
		{name: "no access mode", cap: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}},
			msg: "volume_capability.access_mode is required"},
		{name: "multi-node mode", cap: mountCapability("", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
			msg: "volume_capability.access_mode.mode MULTI_NODE_MULTI_WRITER is not supported; allowed: SINGLE_NODE_WRITER"},
		{name: "no access type", cap: &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: sw}},
			msg: "volume_capability.access_type must be block or mount"},
		{name: "filesystem not in the list", cap: mountCapability("ntfs", sw), msg: `volume_capability.mount.fs_type "ntfs" is not supported; allowed: ext4, xfs`},
		{name: "filesystem carve makes elsewhere", cap: mountCapability("btrfs", sw), elsewhere: true,
			msg: `volume_capability.mount.fs_type "btrfs" cannot be made on this node (mkfs.btrfs is not installed); this node makes ext4, xfs`},
		{name: "two options in one flag", cap: mountCapability("", sw, "noatime", "ro,exec"), msg: `volume_capability.mount.mount_flags[1] "ro,exec" is not allowed`},
		{name: "bind", cap: mountCapability("", sw, "bind"), msg: `mount_flags[0] "bind" is not allowed`},
		{name: "leading dash", cap: mountCapability("", sw, "-oexec"), msg: "mount_flags[0]"},
		{name: "suid", cap: mountCapability("", sw, "suid"), msg: "nodev,nosuid"},
		{name: "dev", cap: mountCapability("", sw, "noatime", "dev"), msg: "mount_flags[1]"},
		{name: "rw for a reader", cap: mountCapability("", ro, "rw"), msg: `"rw" contradicts access mode SINGLE_NODE_READER_ONLY`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.cap, fsTypes)
			if tc.msg == "" {
				if err != nil || got.Block != tc.want.Block || got.FSType != tc.want.FSType || got.Mode != tc.want.Mode ||
					got.ReadOnly != tc.want.ReadOnly || !slices.Equal(got.Flags, tc.want.Flags) {
					t.Errorf("Parse = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			var ce *Error
			if !errors.As(err, &ce) || !strings.Contains(ce.In("volume_capability"), tc.msg) {
				t.Errorf("Parse = %v, want a Error saying %q", err, tc.msg)
			}
			if got := errors.Is(err, ErrFilesystemElsewhere); got != tc.elsewhere {
				t.Errorf("Parse = %v: errors.Is(ErrFilesystemElsewhere) = %v, want %v", err, got, tc.elsewhere)
			}
		})
	}
}

func TestAccessDescribe(t *testing.T) {
	if got := (Access{Block: true}).Describe(); got != "block" {
		t.Errorf("block: %q", got)
	}
	if got := (Access{FSType: "xfs"}).Describe(); got != "mount (xfs)" {
		t.Errorf("mount: %q", got)
	}
	if got := AccessModes(); len(got) != 4 || !strings.Contains(AccessModeNames(), got[3].String()) {
		t.Errorf("AccessModes = %v, names %q", got, AccessModeNames())
	}
}
