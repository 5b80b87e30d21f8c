package fs

import (
	"os"
	"path/filepath"
)

// MakeMountPoint creates a file (raw block) or directory mount point.
func MakeMountPoint(target string, block bool) error {
	if block {
		return makeFile(target)
	}
	return os.MkdirAll(target, 0o750)
}

func makeFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o640) //nolint:gosec // G302, G304: the kubelet's target path; the device bind-mounted on it replaces its mode
	if err != nil {
		return err
	}
	return f.Close()
}

// IsDirectory tells whether path is a directory (after symlinks).
func IsDirectory(path string) (bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	return st.IsDir(), nil
}

// SamePath resolves only ours, so no other mount point is stat'ed.
func SamePath(mounted, ours string) bool {
	r, err := filepath.EvalSymlinks(ours)
	if err != nil {
		r = filepath.Clean(ours)
	}
	return mounted == r || mounted == filepath.Clean(ours)
}
