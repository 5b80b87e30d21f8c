package driver

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/provision"
	"github.com/carve-csi/carve/pkg/volume"
)

// ParamDeviceClass is the StorageClass parameter that names the device
// class; without it the node's default class is used.
const ParamDeviceClass = "carve.dev/device-class"

// paramPassThroughPrefix marks parameters external-provisioner adds
// (csi.storage.k8s.io/pvc/name, ... with --extra-create-metadata); they
// are accepted, and the claim's are recorded in the LV's tags (tags.go).
const paramPassThroughPrefix = "csi.storage.k8s.io/" //nolint:gosec // G101: a parameter prefix, not a credential

// DefaultFSType is the filesystem of a mount volume that names none.
const DefaultFSType = "ext4"

var classNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// supportedAccessModes are the single-node modes; carve volumes live on one
// node's disks.
var supportedAccessModes = []csi.VolumeCapability_AccessMode_Mode{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
}

func accessModeNames() string {
	var names []string
	for _, m := range supportedAccessModes {
		names = append(names, m.String())
	}
	return strings.Join(names, ", ")
}

// checkVolumeName validates a CSI volume name.
func checkVolumeName(name string) error {
	switch {
	case name == "":
		return status.Error(codes.InvalidArgument, "name: must be set")
	case len(name) > volume.MaxNameLength:
		return status.Errorf(codes.InvalidArgument, "name: %d bytes long; at most %d are allowed", len(name), volume.MaxNameLength)
	}
	return nil
}

// checkCapabilities validates volume capabilities and returns the fsType
// of the mount capabilities ("" when all are block). fsTypes lists the
// filesystems this node can make.
func checkCapabilities(caps []*csi.VolumeCapability, fsTypes []string) (string, error) {
	if len(caps) == 0 {
		return "", status.Error(codes.InvalidArgument, "volume_capabilities: at least one capability must be given")
	}
	fsType := ""
	for i, c := range caps {
		if err := checkCreateCapability(c, fsTypes); err != nil {
			return "", status.Errorf(codes.InvalidArgument, "volume_capabilities[%d]: %v", i, err)
		}
		if m := c.GetMount(); m != nil {
			t := m.GetFsType()
			if t == "" {
				t = DefaultFSType
			}
			if fsType != "" && t != fsType {
				return "", status.Errorf(codes.InvalidArgument, "volume_capabilities[%d]: fs_type %q conflicts with %q of another capability", i, t, fsType)
			}
			fsType = t
		}
	}
	return fsType, nil
}

// checkCreateCapability returns a plain error (the callers add the code).
func checkCreateCapability(c *csi.VolumeCapability, fsTypes []string) error {
	if c == nil {
		return fmt.Errorf("empty capability")
	}
	mode := c.GetAccessMode().GetMode()
	if !slices.Contains(supportedAccessModes, mode) {
		return fmt.Errorf("access mode %s is not supported; carve volumes live on one node: use one of %s", mode, accessModeNames())
	}
	switch {
	case c.GetBlock() != nil:
	case c.GetMount() != nil:
		t := c.GetMount().GetFsType()
		if t != "" && !slices.Contains(fsTypes, t) {
			return fmt.Errorf("fs_type %q is not supported on this node; use one of %s", t, strings.Join(fsTypes, ", "))
		}
	default:
		return fmt.Errorf("access_type must be block or mount")
	}
	return nil
}

// classFromParameters picks the device class named by parameters.
// Unknown keys are InvalidArgument; a well-formed class name that this node
// has no class for is provision.ErrElsewhere, answered ResourceExhausted
// (the scheduler should try a node that has it, and this node reports no
// capacity for it).
func classFromParameters(params map[string]string, cfg *config.Config, node string) (*config.DeviceClass, error) {
	name := ""
	for k, v := range params {
		switch {
		case k == ParamDeviceClass:
			name = v
		case strings.HasPrefix(k, paramPassThroughPrefix):
		default:
			return nil, status.Errorf(codes.InvalidArgument, "parameters: unknown key %q; carve accepts %q and keys starting with %q", k, ParamDeviceClass, paramPassThroughPrefix)
		}
	}
	if name != "" && (len(name) > 63 || !classNameRE.MatchString(name)) {
		return nil, status.Errorf(codes.InvalidArgument, "parameters: %s %q is not a device class name (a DNS-1123 label)", ParamDeviceClass, name)
	}
	d, ok := cfg.Class(name)
	if !ok {
		if name == "" {
			return nil, status.Errorf(codes.InvalidArgument, "parameters: %s is not set and node %s has no default device class; its classes: %s", ParamDeviceClass, node, strings.Join(cfg.Names(), ", "))
		}
		return nil, provision.Errorf(provision.ErrElsewhere, "parameters: device class %q is not configured on node %s; its classes: %s", name, node, strings.Join(cfg.Names(), ", "))
	}
	return d, nil
}
