package iolimit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/volume"
)

const uid = "0f4c5b1e-8a3d-4c2b-9e7f-1a2b3c4d5e6f"

func TestLine(t *testing.T) {
	for _, tc := range []struct {
		l    volume.IOLimits
		want string
	}{
		{volume.IOLimits{WriteBPS: 10 << 20}, "253:4 rbps=max wbps=10485760 riops=max wiops=max"},
		{volume.IOLimits{ReadBPS: 1, WriteBPS: 2, ReadIOPS: 3, WriteIOPS: 4}, "253:4 rbps=1 wbps=2 riops=3 wiops=4"},
		// No limit: every key max, which takes the device's entry out.
		{volume.IOLimits{}, "253:4 rbps=max wbps=max riops=max wiops=max"},
	} {
		if got := Line(Device{Major: 253, Minor: 4}, tc.l); got != tc.want {
			t.Errorf("Line(%+v) = %q, want %q", tc.l, got, tc.want)
		}
	}
}

func TestPodUID(t *testing.T) {
	for target, want := range map[string]string{
		"/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount":                   uid,
		"/var/lib/kubelet/pods/" + strings.ToUpper(uid) + "/volumes/kubernetes.io~csi/pvc-1/mount/": uid,
		"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/" + uid:             uid,
		"/data/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount":                      uid,
		"/var/lib/kubelet/plugins/kubernetes.io/csi/lvm.carve.dev/0123abcd/globalmount":             "",
		"/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~empty-dir/x":                       "",
		"/tmp/csi-sanity/target": "",
		"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1": "",
		"/var/lib/kubelet/pods/not-a-uid/volumes/kubernetes.io~csi/pvc-1/mount":  "",
	} {
		got, ok := PodUID(target)
		if got != want || ok != (want != "") {
			t.Errorf("PodUID(%q) = %q, %v; want %q", target, got, ok, want)
		}
	}
}

// tree makes a fake cgroup v2 root with controllers and the directories
// dirs (each with an empty io.max unless noIO).
func tree(t *testing.T, controllers string, noIO bool, dirs ...string) string {
	t.Helper()
	root := t.TempDir()
	if controllers != "" {
		if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte(controllers+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if !noIO {
			if err := os.WriteFile(filepath.Join(root, d, "io.max"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func TestSupport(t *testing.T) {
	for _, tc := range []struct {
		name, controllers, root, want string
	}{
		{name: "v2 with io", controllers: "cpuset cpu io memory pids", want: ReasonOK},
		{name: "v2 without io", controllers: "cpuset cpu memory pids", want: ReasonNoIOController},
		{name: "no cgroup.controllers (v1 or nothing)", want: ReasonNoCgroupV2},
		{name: "off", root: "-", want: ReasonDisabled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Cgroups{Root: tree(t, tc.controllers, false)}
			if tc.root == "-" {
				c.Root = ""
			}
			reason, err := c.Support()
			if reason != tc.want || (err == nil) != (tc.want == ReasonOK) || (err != nil && !errors.Is(err, ErrUnsupported)) {
				t.Errorf("Support = %q, %v; want %q", reason, err, tc.want)
			}
		})
	}
}

func TestPodDir(t *testing.T) {
	sysd := strings.ReplaceAll(uid, "-", "_")
	for _, tc := range []struct {
		name string
		dir  string // where the pod's cgroup is; "" for nowhere
	}{
		{"cgroupfs burstable", "kubepods/burstable/pod" + uid},
		{"cgroupfs besteffort", "kubepods/besteffort/pod" + uid},
		{"cgroupfs guaranteed", "kubepods/pod" + uid},
		{"systemd burstable", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + sysd + ".slice"},
		{"systemd besteffort", "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + sysd + ".slice"},
		{"systemd guaranteed", "kubepods.slice/kubepods-pod" + sysd + ".slice"},
		{"kubelet --cgroup-root", "k8s/kubepods/burstable/pod" + uid},
		{"not there", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Other pods and containers beside it, and a system slice the
			// walk does not enter.
			others := []string{"kubepods/burstable/pod11111111-2222-3333-4444-555555555555/abc",
				"system.slice/containerd.service", "system.slice/x/kubepods/pod" + uid}
			if tc.dir != "" {
				others = append(others, tc.dir, tc.dir+"/0123456789abcdef")
			}
			c := Cgroups{Root: tree(t, "io", false, others...)}
			got, err := c.PodDir(uid)
			if tc.dir == "" {
				if !errors.Is(err, ErrNoPod) {
					t.Fatalf("PodDir = %q, %v; want ErrNoPod", got, err)
				}
				return
			}
			if err != nil || got != filepath.Join(c.Root, tc.dir) {
				t.Fatalf("PodDir = %q, %v; want %s", got, err, tc.dir)
			}
		})
	}
}

func TestSet(t *testing.T) {
	c := Cgroups{Root: tree(t, "io", false, "kubepods/burstable/pod"+uid)}
	dir := filepath.Join(c.Root, "kubepods/burstable/pod"+uid)
	l := volume.IOLimits{WriteBPS: 4 << 20, ReadIOPS: 100}
	if err := c.Set(dir, Device{253, 7}, l); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "io.max"))
	if err != nil || string(b) != "253:7 rbps=max wbps=4194304 riops=100 wiops=max" {
		t.Fatalf("io.max holds %q, %v", b, err)
	}
	// The io controller not enabled for the pod: no io.max file, and none
	// is made.
	c = Cgroups{Root: tree(t, "io", true, "kubepods/pod"+uid)}
	dir = filepath.Join(c.Root, "kubepods/pod"+uid)
	if err := c.Set(dir, Device{253, 7}, l); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "cgroup.subtree_control") {
		t.Fatalf("Set without io.max = %v, want ErrUnsupported naming subtree_control", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "io.max")); !os.IsNotExist(err) {
		t.Errorf("Set made io.max: %v", err)
	}
}

func TestDeviceOf(t *testing.T) {
	if _, err := DeviceOf(filepath.Join(t.TempDir())); err == nil {
		t.Error("a directory read as a block device")
	}
	if _, err := os.Stat("/dev/loop0"); err == nil {
		if d, err := DeviceOf("/dev/loop0"); err != nil || d.Major != 7 {
			t.Errorf("DeviceOf(/dev/loop0) = %v, %v; want 7:0", d, err)
		}
	}
}
