// Package iolimit applies a volume's IO limits to the pods it is published
// to: a line of the pod cgroup's io.max for the device's major:minor. The pod
// cgroup is found from the UID in the kubelet's target path, under both
// cgroup drivers' names. A node without cgroup v2 or the io controller is an
// error (ErrUnsupported), never a limit silently left out.
package iolimit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/carve-csi/carve/internal/volume"
)

// ErrUnsupported: no cgroup v2, no io controller, or none configured.
var ErrUnsupported = errors.New("this node cannot apply IO limits")

// ErrNoPod: no pod cgroup found (gone, or not made yet).
var ErrNoPod = errors.New("pod cgroup not found")

// Reasons of Support, as the metric carve_io_limits_supported shows them.
const (
	ReasonOK             = "ok"
	ReasonDisabled       = "disabled"
	ReasonNoCgroupV2     = "no-cgroup-v2"
	ReasonNoIOController = "no-io-controller"
)

// Device is a block device's numbers.
type Device struct{ Major, Minor uint32 }

func (d Device) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// Line is the io.max line setting l for dev, "max" where unset, so it
// replaces dev's entry (all "max" removes it).
func Line(dev Device, l volume.IOLimits) string {
	return dev.String() + " " + l.String()
}

// The kubelet's target paths, of a filesystem and of a raw block volume.
var (
	uidPattern   = `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`
	mountTarget  = regexp.MustCompile(`/pods/(` + uidPattern + `)/volumes/kubernetes\.io~csi/[^/]+/mount$`)
	deviceTarget = regexp.MustCompile(`/volumeDevices/publish/[^/]+/(` + uidPattern + `)$`)
)

// PodUID returns the UID of the pod a kubelet target path belongs to.
func PodUID(target string) (string, bool) {
	target = filepath.Clean(target)
	for _, re := range []*regexp.Regexp{mountTarget, deviceTarget} {
		if m := re.FindStringSubmatch(target); m != nil {
			return strings.ToLower(m[1]), true
		}
	}
	return "", false
}

// Cgroups is the host's cgroup v2 hierarchy as the agent sees it.
type Cgroups struct {
	// Root empty turns IO limits off.
	Root string
}

// Support is nil, or ErrUnsupported with its reason (a Reason* constant).
func (c Cgroups) Support() (string, error) {
	if c.Root == "" {
		return ReasonDisabled, fmt.Errorf("%w: no cgroup root configured (--cgroup-root)", ErrUnsupported)
	}
	b, err := os.ReadFile(filepath.Join(c.Root, "cgroup.controllers"))
	if err != nil {
		return ReasonNoCgroupV2, fmt.Errorf("%w: %s is not a cgroup v2 hierarchy (reading cgroup.controllers: %w)", ErrUnsupported, c.Root, err)
	}
	if !slices.Contains(strings.Fields(string(b)), "io") {
		return ReasonNoIOController, fmt.Errorf("%w: the io controller is not available in %s (cgroup.controllers: %q)", ErrUnsupported, c.Root, strings.TrimSpace(string(b)))
	}
	return ReasonOK, nil
}

func podDirNames(uid string) []string {
	u := strings.ReplaceAll(uid, "-", "_")
	return []string{"pod" + uid, "kubepods-pod" + u + ".slice", "kubepods-burstable-pod" + u + ".slice", "kubepods-besteffort-pod" + u + ".slice"}
}

// kubepodsParents are the kubelet's default pod cgroup parents by QoS.
var kubepodsParents = []string{
	"kubepods", "kubepods/burstable", "kubepods/besteffort",
	"kubepods.slice", "kubepods.slice/kubepods-burstable.slice", "kubepods.slice/kubepods-besteffort.slice",
}

// PodDir returns pod uid's cgroup: first where the kubelet puts it by
// default, then up to four levels down through *kubepods*, burstable or
// besteffort directories (a custom --cgroup-root); nothing else is read.
func (c Cgroups) PodDir(uid string) (string, error) {
	names := podDirNames(uid)
	for _, p := range kubepodsParents {
		for _, n := range names {
			if d := filepath.Join(c.Root, p, n); isDir(d) {
				return d, nil
			}
		}
	}
	var found string
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range entries {
			if found != "" || !e.IsDir() {
				continue
			}
			if slices.Contains(names, e.Name()) {
				found = filepath.Join(dir, e.Name())
				return
			}
			if depth < 3 && (dir == c.Root || strings.Contains(e.Name(), "kubepods") || e.Name() == "burstable" || e.Name() == "besteffort") {
				walk(filepath.Join(dir, e.Name()), depth+1)
			}
		}
	}
	walk(c.Root, 0)
	if found == "" {
		return "", fmt.Errorf("%w: pod %s under %s", ErrNoPod, uid, c.Root)
	}
	return found, nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// Set writes l for dev into dir's io.max. No io.max (the parent does not
// enable io in cgroup.subtree_control) is ErrUnsupported.
func (c Cgroups) Set(dir string, dev Device, l volume.IOLimits) error {
	file := filepath.Join(dir, "io.max")
	if _, err := os.Stat(file); err != nil {
		return fmt.Errorf("%w: %s has no io.max (the io controller is not enabled for it in %s): %w",
			ErrUnsupported, dir, filepath.Join(filepath.Dir(dir), "cgroup.subtree_control"), err)
	}
	// No O_CREATE: no file is ever made; cgroup files take O_TRUNC.
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0) //nolint:gosec // G304: io.max of a pod's cgroup under the configured root, found by PodDir

	if err != nil {
		return fmt.Errorf("opening %s: %w", file, err)
	}
	_, werr := f.WriteString(Line(dev, l))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("writing %q to %s: %w", Line(dev, l), file, werr)
	}
	return nil
}

// DeviceOf returns the numbers of the block device node at path.
func DeviceOf(path string) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return Device{}, fmt.Errorf("%s is not a block device", path)
	}
	return Device{Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}, nil
}
