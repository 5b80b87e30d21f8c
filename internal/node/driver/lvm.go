package driver

import "github.com/carve-csi/carve/internal/node/provision"

// LVM is what the CSI servers need of LVM.
type LVM = provision.LVM
