package volume

// ParamDeviceClass is the StorageClass parameter that names the device
// class; without it the node's default class is used. CreateVolume also
// puts it into the volume context, where stage and publish read it.
const ParamDeviceClass = "carve.dev/device-class"

// ContextVolumeName is the volume context key of the volume's CSI name:
// CreateVolume puts it there (carve controller checks it), and stage and
// publish serve a handle only with the name its LV was made for, so that
// a PersistentVolume written with another volume's handle reaches nothing.
const ContextVolumeName = "carve.dev/volume-name"

// DefaultFSType is the filesystem of a mount volume that names none.
const DefaultFSType = "ext4"

// DefaultVolumeSize is the size of a volume whose request names none
// (required_bytes and limit_bytes both 0).
const DefaultVolumeSize = 1 << 30
