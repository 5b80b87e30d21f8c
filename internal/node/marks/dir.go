package marks

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

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

// Adopt moves the marks of the directory old (laid out as Open's, by an
// earlier carve) into m: each is made in m with its content, durably,
// then removed from old, so that a crash in between leaves it in both and
// the next Adopt finishes. A missing old is nothing to adopt. It returns
// how many marks it moved.
func (m *Marks) Adopt(old string) (int, error) {
	if filepath.Clean(old) == filepath.Clean(m.dir) {
		return 0, nil
	}
	vgs, err := os.ReadDir(old)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the marks of %s: %w", old, err)
	}
	moved := 0
	for _, vg := range vgs {
		if !vg.IsDir() {
			continue
		}
		vgDir := filepath.Join(old, vg.Name())
		lvs, err := os.ReadDir(vgDir)
		if err != nil {
			return moved, fmt.Errorf("reading the marks of %s: %w", old, err)
		}
		for _, lv := range lvs {
			if !lv.Type().IsRegular() {
				continue
			}
			if err := m.adoptOne(filepath.Join(vgDir, lv.Name()), vg.Name(), lv.Name()); err != nil {
				return moved, err
			}
			moved++
		}
		if err := syncDir(vgDir); err != nil {
			return moved, err
		}
		// Empty now, unless something else is there: then it stays.
		_ = os.Remove(vgDir)
	}
	return moved, nil
}

// adoptOne moves the mark at oldPath, of vg/lv, into m.
func (m *Marks) adoptOne(oldPath, vg, lv string) error {
	p, err := m.path(vg, lv)
	if err != nil {
		return fmt.Errorf("adopting the mark %s: %w", oldPath, err)
	}
	// A mark in m already is the newer one.
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		content, err := readSmall(oldPath)
		if err != nil {
			return fmt.Errorf("adopting the mark %s: %w", oldPath, err)
		}
		if err := m.write(p, content); err != nil {
			return fmt.Errorf("adopting the mark %s into %s: %w", oldPath, m.dir, err)
		}
	}
	if err := os.Remove(oldPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("adopting the mark %s: %w", oldPath, err)
	}
	return nil
}
