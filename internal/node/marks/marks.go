// Package marks keeps durable marks of the LVs carve has begun to make and
// not handed out. lvcreate commits an LV before it wipes and zeroes it, so a
// power cut in between leaves an LV over a deleted volume's data; its mark
// has the retried CreateVolume erase or remake it.
//
// A mark is a file <dir>/<vg>/<lv>, synced before lvcreate and removed once
// the LV is ready: two directory syncs instead of a second LVM metadata
// commit. MarkOf's mark holds the LV's UUID, so it is never taken for a new
// LV's of the same name. The directory must outlive reboots (Volatile).
package marks

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Marks is the set of marks under one directory; callers serialise calls
// for one LV.
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

// path keeps the mark inside dir: LVM names hold no slash and are never "."
// or "..".
func (m *Marks) path(vg, lv string) (string, error) {
	for _, n := range []string{vg, lv} {
		if n == "" || n == "." || n == ".." || filepath.Base(n) != n {
			return "", fmt.Errorf("unfinished-volume mark of %q/%q: not an LVM name", vg, lv)
		}
	}
	return filepath.Join(m.dir, vg, lv), nil
}

// Mark records durably that vg/lv is being made; it returns once the mark
// survives a power loss. An existing mark is kept.
func (m *Marks) Mark(vg, lv string) error {
	return m.mark(vg, lv, nil)
}

// MarkOf is Mark for an existing LV: the mark holds owner, its UUID.
func (m *Marks) MarkOf(vg, lv, owner string) error {
	if !ownerRE.MatchString(owner) {
		return fmt.Errorf("marking %s/%s unfinished: owner %q is not an LVM UUID", vg, lv, owner)
	}
	return m.mark(vg, lv, []byte(owner+"\n"))
}

func (m *Marks) mark(vg, lv string, content []byte) error {
	p, err := m.path(vg, lv)
	if err != nil {
		return err
	}
	if err := m.write(p, content); err != nil {
		return fmt.Errorf("marking %s/%s unfinished: %w", vg, lv, err)
	}
	return nil
}

// write makes mark p durably (nil content keeps an existing one).
func (m *Marks) write(p string, content []byte) error {
	vgDir := filepath.Dir(p)
	if _, err := os.Stat(vgDir); errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(vgDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := syncDir(m.dir); err != nil {
			return err
		}
	}
	flags := os.O_CREATE | os.O_WRONLY
	if content != nil {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(p, flags, 0o600) //nolint:gosec // G304: path checks that the names stay inside the directory
	if err != nil {
		return err
	}
	if content != nil {
		_, err = f.Write(content)
		if err == nil {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return syncDir(vgDir)
}

var ownerRE = regexp.MustCompile(`^[0-9A-Za-z]{6}(-[0-9A-Za-z]{4}){5}-[0-9A-Za-z]{6}$`)

// Owner returns the owner vg/lv's mark names ("" for Mark's, or one torn by
// a crash) and whether it is marked.
func (m *Marks) Owner(vg, lv string) (owner string, marked bool, err error) {
	p, err := m.path(vg, lv)
	if err != nil {
		return "", false, err
	}
	b, err := readSmall(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("reading the unfinished-volume mark of %s/%s: %w", vg, lv, err)
	}
	if o := strings.TrimSpace(string(b)); ownerRE.MatchString(o) {
		return o, true, nil
	}
	return "", true, nil
}

func readSmall(p string) ([]byte, error) {
	f, err := os.Open(p) //nolint:gosec // G304: a mark's path (path, or the walk of the marks' directory)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read-only
	b := make([]byte, 128)
	n, err := f.Read(b)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}

// Clear removes vg/lv's mark durably; none is no error. A mark back after a
// power loss would remake a handed-out volume, so callers answer only after
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
