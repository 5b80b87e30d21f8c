package volume

// ParamDeviceClass is the StorageClass parameter naming the device class.
const ParamDeviceClass = "carve.dev/device-class"

// ContextVolumeName is the volume context key of the CSI name: stage and publish serve a
// handle only with its LV's name, so a PV with another volume's handle reaches nothing.
const ContextVolumeName = "carve.dev/volume-name"

// DefaultFSType is the filesystem of a mount volume that names none.
const DefaultFSType = "ext4"

// DefaultVolumeSize is the size when the request names none.
const DefaultVolumeSize = 1 << 30
