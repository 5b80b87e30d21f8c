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
	"github.com/carve-csi/carve/pkg/state"
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

// DefaultVolumeSize is the size of a volume whose request names none
// (required_bytes and limit_bytes both 0).
const DefaultVolumeSize = 1 << 30

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
// has no class for is ResourceExhausted (the scheduler should try a node
// that has it, and this node reports no capacity for it).
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
		return nil, status.Errorf(codes.ResourceExhausted, "parameters: device class %q is not configured on node %s; its classes: %s", name, node, strings.Join(cfg.Names(), ", "))
	}
	return d, nil
}

// minFilesystemSize is the smallest device a filesystem can be made on:
// mkfs.xfs (xfsprogs 5.19 and later, the image's 6.1) refuses anything
// under 300 MiB, which would fail every NodeStage of a smaller volume.
var minFilesystemSize = map[string]uint64{"xfs": 300 << 20}

// volumeSize resolves a capacity range to a size in whole units, unit being
// the step LVM rounds the class's LVs to (lvm.LVOptions.SizeUnit: an extent,
// or an extent per stripe): required_bytes rounded up, and up to the
// smallest size fsType can be made on ("" for a block volume); 0 means
// DefaultVolumeSize (or limit_bytes, when smaller); OutOfRange when the size
// exceeds limit_bytes. The size is the one LVM will make, so a volume is
// never larger than limit_bytes.
func volumeSize(r *csi.CapacityRange, unit uint64, fsType string) (uint64, error) {
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	switch {
	case req < 0:
		return 0, status.Errorf(codes.InvalidArgument, "capacity_range: required_bytes %d is negative", req)
	case lim < 0:
		return 0, status.Errorf(codes.InvalidArgument, "capacity_range: limit_bytes %d is negative", lim)
	case lim > 0 && req > lim:
		return 0, status.Errorf(codes.InvalidArgument, "capacity_range: required_bytes %d exceeds limit_bytes %d", req, lim)
	}
	size := uint64(req)
	if size == 0 {
		size = DefaultVolumeSize
		if lim > 0 && uint64(lim) < size {
			// The largest whole number of units within the limit.
			size = uint64(lim) / unit * unit
			if size == 0 {
				return 0, status.Errorf(codes.OutOfRange, "capacity_range: limit_bytes %d is smaller than one extent (%d bytes, an extent per stripe for a striped class)", lim, unit)
			}
		}
	}
	if floor := minFilesystemSize[fsType]; size < floor {
		if lim > 0 && uint64(lim) < floor {
			return 0, status.Errorf(codes.OutOfRange, "capacity_range: limit_bytes %d is below the %d bytes a %s filesystem needs", lim, floor, fsType)
		}
		size = floor
	}
	size = state.RoundUp(size, unit)
	if lim > 0 && size > uint64(lim) {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range: %d bytes rounded up to whole extents (a multiple of %d bytes, an extent per stripe for a striped class) is %d, above limit_bytes %d", req, unit, size, lim)
	}
	return size, nil
}

// sizeFits tells whether an existing volume of size bytes satisfies r.
func sizeFits(size uint64, r *csi.CapacityRange) bool {
	if req := r.GetRequiredBytes(); req > 0 && size < uint64(req) {
		return false
	}
	if lim := r.GetLimitBytes(); lim > 0 && size > uint64(lim) {
		return false
	}
	return true
}
