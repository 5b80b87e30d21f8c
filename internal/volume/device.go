package volume

import (
	"os"
	"path"
	"strings"
)

// DefaultDevDir is where LVM makes device nodes when DM_DEV_DIR is not set.
const DefaultDevDir = "/dev"

// DevDir is the last non-empty DM_DEV_DIR of env, else DefaultDevDir; lvm.New repeats
// the rule (lvm cannot import this package), and both are tested.
func DevDir(env []string) string {
	dir := DefaultDevDir
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "DM_DEV_DIR="); ok && v != "" {
			dir = v
		}
	}
	return dir
}

// Device is the device node of id under devDir: <devDir>/<vg>/<lv>.
func Device(devDir string, id ID) string { return path.Join(devDir, id.VG, id.LV) }

// IsBlockDevice tells whether p (after symlinks) is a block device node.
func IsBlockDevice(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0
}
