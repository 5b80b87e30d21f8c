package marks

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// statfs f_type magics (linux/magic.h) of filesystems a reboot empties.
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// Volatile names dir's filesystem when a reboot empties it (tmpfs, ramfs),
// else "". Marks lost there would hand out a half-erased LV, or fail every
// stage after a killed mkfs.
func Volatile(dir string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "", fmt.Errorf("statfs %s: %w", dir, err)
	}
	switch uint32(st.Type) {
	case tmpfsMagic:
		return "tmpfs", nil
	case ramfsMagic:
		return "ramfs", nil
	}
	return "", nil
}
