package marks

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Filesystem magic numbers (statfs f_type, linux/magic.h) of the
// filesystems whose files do not outlive a reboot.
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// Volatile names the filesystem dir is on when it does not outlive a
// reboot (tmpfs, ramfs), "" otherwise. Marks there are lost with the
// node's power, and with them what they protect (an LV half erased is
// handed out, a filesystem whose mkfs was killed fails every stage).
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
