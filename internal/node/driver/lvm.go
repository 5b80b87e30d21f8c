package driver

import "github.com/carve-csi/carve/internal/node/provision"

// LVM is what the CSI servers need of LVM (provision.LVM); the node
// server uses it as well.
type LVM = provision.LVM
