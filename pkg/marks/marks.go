// Package marks keeps durable marks of the logical volumes carve has
// begun to make and not yet handed out.
//
// lvcreate commits a new LV to the volume group's metadata before it wipes
// its signatures and zeroes its start, and a raw-block volume is erased
// after that. A node that loses power in between, or a container killed
// with its lvcreate, leaves an LV over extents that still hold what a
// deleted volume left. Its mark says so to the retried CreateVolume, which
// then erases or remakes it instead of handing it out.
//
// A mark is an empty file, <dir>/<vg>/<lv>, made and synced before
// lvcreate runs and removed, synced again, once the LV is ready. That
// costs two directory syncs where a tag taken off with lvchange would cost
// a second LVM metadata commit. The directory must outlive the plugin's
// container and the node's reboots (the DaemonSet's plugin directory on
// the host does).
package marks

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Marks is the set of marks under one directory. Its methods may be called
// concurrently for different LVs; the caller serialises calls for one LV.
type Marks struct {
	dir string
}

// Open returns the marks under dir, making it (mode 0700) when missing.
func Open(dir string) (*Marks, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("directory of unfinished-volume marks %q: must be an absolute path", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making the directory of unfinished-volume marks: %w", err)
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return nil, err
	}
	return &Marks{dir: dir}, nil
}

// Dir is the directory the marks live in.
func (m *Marks) Dir() string { return m.dir }

// path is the mark of vg/lv. LVM names hold no slash and are never "." or
// "..", so the path stays inside dir; check rejects anything else.
func (m *Marks) path(vg, lv string) (string, error) {
	for _, n := range []string{vg, lv} {
		if n == "" || n == "." || n == ".." || filepath.Base(n) != n {
			return "", fmt.Errorf("unfinished-volume mark of %q/%q: not an LVM name", vg, lv)
		}
	}
	return filepath.Join(m.dir, vg, lv), nil
}

// Mark records, durably, that vg/lv is being made. It returns once the
// mark would survive a power loss.
func (m *Marks) Mark(vg, lv string) error {
	p, err := m.path(vg, lv)
	if err != nil {
		return err
	}
	vgDir := filepath.Dir(p)
	if _, err := os.Stat(vgDir); errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(vgDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("marking %s/%s unfinished: %w", vg, lv, err)
		}
		if err := syncDir(m.dir); err != nil {
			return fmt.Errorf("marking %s/%s unfinished: %w", vg, lv, err)
		}
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600) //nolint:gosec // G304: path checks that the names stay inside the directory
	if err != nil {
		return fmt.Errorf("marking %s/%s unfinished: %w", vg, lv, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("marking %s/%s unfinished: %w", vg, lv, err)
	}
	if err := syncDir(vgDir); err != nil {
		return fmt.Errorf("marking %s/%s unfinished: %w", vg, lv, err)
	}
	return nil
}

// Clear removes the mark of vg/lv, durably; no mark is no error. A mark
// that came back after a power loss would make a retried CreateVolume
// remake a volume already handed out, so the caller answers only after
// Clear returned.
func (m *Marks) Clear(vg, lv string) error {
	p, err := m.path(vg, lv)
	if err != nil {
		return err
	}
	err = os.Remove(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("marking %s/%s finished: %w", vg, lv, err)
	}
	if err := syncDir(filepath.Dir(p)); err != nil {
		return fmt.Errorf("marking %s/%s finished: %w", vg, lv, err)
	}
	return nil
}

// Has tells whether vg/lv is marked unfinished.
func (m *Marks) Has(vg, lv string) (bool, error) {
	p, err := m.path(vg, lv)
	if err != nil {
		return false, err
	}
	_, err = os.Lstat(p)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("reading the unfinished-volume mark of %s/%s: %w", vg, lv, err)
}

// syncDir makes the entries of dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir) //nolint:gosec // G304: the marks' own directories
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
