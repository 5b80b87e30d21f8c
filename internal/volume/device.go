package volume

import (
	"os"
	"path"
	"strings"
)

// DefaultDevDir is where LVM makes device nodes when DM_DEV_DIR is not set.
const DefaultDevDir = "/dev"

// DevDir is the directory LVM makes device nodes under for a process whose
// environment is env (KEY=VALUE items, os.Environ()): the last non-empty
// DM_DEV_DIR, else DefaultDevDir. lvm.New applies the same rule to the
// environment of its commands; lvm cannot import this package (this
// package imports lvm), so the rule is written twice, tested both times.
func DevDir(env []string) string {
	dir := DefaultDevDir
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "DM_DEV_DIR="); ok && v != "" {
			dir = v
		}
	}
	return dir
}

// Device is the device node of the volume id under devDir (DevDir):
// <devDir>/<volume group>/<LV name>, the link LVM makes.
func Device(devDir string, id ID) string { return path.Join(devDir, id.VG, id.LV) }

// IsBlockDevice tells whether p (after symlinks) is a block device node.
func IsBlockDevice(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0
}
