// Package capability reads the CSI volume capabilities a node serves.
package capability

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/volume"
)

// accessModes are single-node: carve volumes live on one node's disks.
var accessModes = []csi.VolumeCapability_AccessMode_Mode{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
}

// AccessModes returns the access modes carve serves.
func AccessModes() []csi.VolumeCapability_AccessMode_Mode { return slices.Clone(accessModes) }

// AccessModeNames lists AccessModes for messages.
func AccessModeNames() string {
	names := make([]string, 0, len(accessModes))
	for _, m := range accessModes {
		names = append(names, m.String())
	}
	return strings.Join(names, ", ")
}

// mountFlagPattern: mount flags reach mount(8)'s argv, so they are checked.
var mountFlagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.=:/+@-]*$`)

// forbiddenMountFlags would change what kind of mount carve makes.
var forbiddenMountFlags = []string{"bind", "rbind", "remount", "move"}

// Access is a volume capability carve accepts, read once.
type Access struct {
	Block bool
	// FSType is a mount capability's filesystem (volume.DefaultFSType when
	// unnamed); "" for a block volume.
	FSType   string
	Flags    []string
	Mode     csi.VolumeCapability_AccessMode_Mode
	ReadOnly bool
}

// Describe names the access type for messages: "block" or "mount (ext4)".
func (a Access) Describe() string {
	if a.Block {
		return "block"
	}
	return fmt.Sprintf("mount (%s)", a.FSType)
}

// Error is what Parse refuses: Part is the part at fault ("" for all,
// "access_mode", "mount.mount_flags[1]", ...), Reason what is wrong.
type Error struct {
	Part, Reason string
	// Err is ErrFilesystemElsewhere, or nil.
	Err error
}

func (e *Error) Error() string { return e.In("capability") }

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// ErrFilesystemElsewhere: carve makes the filesystem but this node lacks its
// mkfs. Another node may have it, so the answer is RESOURCE_EXHAUSTED (which
// reschedules a WaitForFirstConsumer claim), not INVALID_ARGUMENT.
var ErrFilesystemElsewhere = errors.New("the filesystem's mkfs is not installed on this node")

// In is the message for a capability that came as field of a request.
func (e *Error) In(field string) string {
	if e.Part == "" {
		return field + " " + e.Reason
	}
	return field + "." + e.Part + " " + e.Reason
}

func refuse(part, format string, args ...any) error {
	return &Error{Part: part, Reason: fmt.Sprintf(format, args...)}
}

// Parse reads a volume capability for both CSI servers: a served access
// mode, block or mount, a filesystem among fsTypes, and single safe mount
// flags. Its errors are *Error.
func Parse(c *csi.VolumeCapability, fsTypes []string) (Access, error) {
	var a Access
	if c == nil {
		return a, refuse("", "is required")
	}
	if c.GetAccessMode() == nil {
		return a, refuse("access_mode", "is required")
	}
	a.Mode = c.GetAccessMode().GetMode()
	if !slices.Contains(accessModes, a.Mode) {
		return a, refuse("access_mode.mode", "%s is not supported; allowed: %s", a.Mode, AccessModeNames())
	}
	a.ReadOnly = a.Mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		a.Block = true
	case *csi.VolumeCapability_Mount:
		a.FSType = t.Mount.GetFsType()
		if a.FSType == "" {
			a.FSType = volume.DefaultFSType
		}
		if !slices.Contains(fsTypes, a.FSType) {
			err := refuse("mount.fs_type", "%q is not supported; allowed: %s", a.FSType, strings.Join(fsTypes, ", "))
			if slices.Contains(fs.MkfsTypes, a.FSType) {
				err = &Error{Part: "mount.fs_type", Err: ErrFilesystemElsewhere,
					Reason: fmt.Sprintf("%q cannot be made on this node (mkfs.%s is not installed); this node makes %s", a.FSType, a.FSType, strings.Join(fsTypes, ", "))}
			}
			return a, err
		}
		flags, err := mountFlags(t.Mount.GetMountFlags(), a)
		if err != nil {
			return a, err
		}
		a.Flags = flags
	default:
		return a, refuse("access_type", "must be block or mount")
	}
	return a, nil
}

func mountFlags(flags []string, a Access) ([]string, error) {
	var out []string
	for i, f := range flags {
		part := fmt.Sprintf("mount.mount_flags[%d]", i)
		switch {
		case !mountFlagPattern.MatchString(f) || slices.Contains(forbiddenMountFlags, f):
			return nil, refuse(part, "%q is not allowed: one option per flag, of letters, digits and _.=:/+@-, not bind, rbind, remount or move", f)
		case f == "suid" || f == "dev":
			return nil, refuse(part, "%q is not allowed: carve mounts volumes nodev,nosuid, so that no device node or setuid program on a volume takes effect", f)
		case f == "rw" && a.ReadOnly:
			return nil, refuse(part, "\"rw\" contradicts access mode %s", a.Mode)
		}
		out = append(out, f)
	}
	return out, nil
}
