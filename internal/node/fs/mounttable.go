package fs

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"
)

// MountInfoLister reads mountinfo, so mounts need no stat.
type MountInfoLister interface {
	MountInfo() ([]mount.MountInfo, error)
}

const procMountInfo = "/proc/self/mountinfo"

// MountInfo implements MountInfoLister.
func (h *HostMounter) MountInfo() ([]mount.MountInfo, error) {
	path := h.mountInfoPath
	if path == "" {
		path = procMountInfo
	}
	infos, err := mount.ParseMountInfo(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return infos, nil
}

// mountsOfDevice returns the mount points showing device; a bind-mounted
// devtmpfs node is found via the bind's root, so the bind's own mount point
// (maybe another pod's) is never stat'ed.
func mountsOfDevice(infos []mount.MountInfo, device string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(device, &st); err != nil {
		return nil, fmt.Errorf("reading the device numbers of %s: %w", device, err)
	}
	major, minor := int(unix.Major(st.Rdev)), int(unix.Minor(st.Rdev))
	devRoots := map[[2]int]string{}
	for _, mi := range infos {
		if mi.FsType == "devtmpfs" && mi.Root == "/" {
			if _, ok := devRoots[[2]int{mi.Major, mi.Minor}]; !ok {
				devRoots[[2]int{mi.Major, mi.Minor}] = mi.MountPoint
			}
		}
	}
	var paths []string
	for _, mi := range infos {
		switch {
		case mi.Major == major && mi.Minor == minor, sameSource(mi.Source, device):
			// btrfs shows an anonymous device number: its source names the device.
			paths = append(paths, tablePath(mi.MountPoint))
		case mi.FsType == "devtmpfs" && mi.Root != "/":
			dir, ok := devRoots[[2]int{mi.Major, mi.Minor}]
			if !ok {
				continue
			}
			var n unix.Stat_t
			if err := unix.Stat(filepath.Join(dir, mi.Root), &n); err == nil && n.Rdev == st.Rdev {
				paths = append(paths, tablePath(mi.MountPoint))
			}
		}
	}
	return paths, nil
}
