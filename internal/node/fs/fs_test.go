package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	mount "k8s.io/mount-utils"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/carve-csi/carve/internal/node/fs/fstest"
)

type ctxKey struct{}

func testCtx() context.Context { return context.WithValue(context.Background(), ctxKey{}, "request") }

// everyCommandHadContext fails the test when a command ran without the
// request's context.
func everyCommandHadContext(t *testing.T, tools *fstest.Tools) {
	t.Helper()
	for i, c := range tools.Contexts() {
		if c == nil || c.Value(ctxKey{}) != "request" {
			t.Errorf("command %v ran without the request's context", tools.Calls()[i])
		}
	}
}

func TestFormatAndMount(t *testing.T) {
	const dev = "/dev/vg1/lv1"
	cases := []struct {
		name          string
		existing      string
		fsType        string
		failMkfs      bool
		mkfsOptions   []string
		wantFormatted bool
		wantMkfs      []string
		refuse        bool
		badOptions    bool // refused before the device is read
		wantErr       bool
		wantMounted   bool
	}{
		{name: "blank device is formatted ext4", fsType: "ext4", wantFormatted: true,
			wantMkfs: []string{"mkfs.ext4", "-F", "-m0", dev}, wantMounted: true},
		{name: "blank device is formatted xfs", fsType: "xfs", wantFormatted: true,
			wantMkfs: []string{"mkfs.xfs", "-f", dev}, wantMounted: true},
		{name: "blank device is formatted btrfs", fsType: "btrfs", wantFormatted: true,
			wantMkfs: []string{"mkfs.btrfs", dev}, wantMounted: true},
		{name: "default xfs options come before mount-utils' own", fsType: "xfs", mkfsOptions: DefaultMkfsOptions("xfs"), wantFormatted: true,
			wantMkfs: []string{"mkfs.xfs", "-K", "-m", "bigtime=0,inobtcount=0", "-i", "nrext64=0", "-f", dev}, wantMounted: true},
		{name: "default ext4 options come before mount-utils' own", fsType: "ext4", mkfsOptions: DefaultMkfsOptions("ext4"), wantFormatted: true,
			wantMkfs: []string{"mkfs.ext4", "-E", "nodiscard", "-O", "^orphan_file", "-F", "-m0", dev}, wantMounted: true},
		{name: "an option outside the allow-list never reaches mkfs", fsType: "xfs", mkfsOptions: []string{"-d", "name=/etc/passwd"}, badOptions: true, wantErr: true},
		{name: "existing ext4 is never formatted", existing: "ext4", fsType: "ext4", wantMounted: true},
		{name: "a partition table is never formatted", existing: fstest.PartitionTable, fsType: "ext4", wantMounted: true},
		{name: "failed mkfs does not mount", fsType: "ext4", failMkfs: true, wantFormatted: true,
			wantMkfs: []string{"mkfs.ext4", "-F", "-m0", dev}, wantErr: true},
		{name: "a blank device the check refuses is left alone", fsType: "ext4", refuse: true, wantErr: true},
		{name: "another filesystem the check refuses is left alone", existing: "xfs", fsType: "ext4", refuse: true, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tools := fstest.New()
			if tc.existing != "" {
				tools.SetFormat(dev, tc.existing)
			}
			if tc.failMkfs {
				tools.Fail("mkfs."+tc.fsType, testingexec.FakeExitError{Status: 1})
			}
			m := mount.NewFakeMounter(nil)
			f := New(m, tools)
			target := t.TempDir()
			refusal := errors.New("refused")
			checked := []string{}
			res, err := f.FormatAndMount(testCtx(), dev, target, tc.fsType, []string{"noatime"}, tc.mkfsOptions, func(existing string) error {
				checked = append(checked, existing)
				if tc.refuse {
					return refusal
				}
				return nil
			})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %t", err, tc.wantErr)
			}
			if tc.refuse && !errors.Is(err, refusal) {
				t.Errorf("err = %v, want the check's error as it is", err)
			}
			want, reads := []string{tc.existing}, 1
			if strings.HasPrefix(tc.existing, "PTTYPE=") {
				want = []string{"unknown data, probably partitions"}
			}
			if tc.badOptions {
				want, reads = []string{}, 0
			}
			if !slices.Equal(checked, want) || res.Probed != !tc.badOptions {
				t.Errorf("check saw %q (probed %t), want %q", checked, res.Probed, want)
			}
			// The signature is read once: mount-utils' own read before
			// mkfs is answered with the one just made.
			if n := len(tools.Ran("blkid")); n != reads {
				t.Errorf("blkid ran %d times, want %d", n, reads)
			}
			if res.Formatted != tc.wantFormatted || res.Mounted != tc.wantMounted {
				t.Errorf("result = %+v, want formatted %t mounted %t", res, tc.wantFormatted, tc.wantMounted)
			}
			mkfs := tools.Ran("mkfs." + tc.fsType)
			if tc.wantMkfs == nil && len(mkfs) > 0 {
				t.Errorf("mkfs ran on a device with a signature: %v", mkfs)
			}
			if tc.wantMkfs != nil && (len(mkfs) != 1 || !reflect.DeepEqual(mkfs[0], tc.wantMkfs)) {
				t.Errorf("mkfs runs = %v, want one %v", mkfs, tc.wantMkfs)
			}
			mounted := len(m.MountPoints) == 1 && m.MountPoints[0].Device == dev && m.MountPoints[0].Path == target &&
				slices.Contains(m.MountPoints[0].Opts, "noatime")
			if mounted != tc.wantMounted {
				t.Errorf("mount points = %+v, want mounted %t", m.MountPoints, tc.wantMounted)
			}
			everyCommandHadContext(t, tools)
		})
	}
}

func TestDiskFormat(t *testing.T) {
	tools := fstest.New()
	f := New(mount.NewFakeMounter(nil), tools)
	tools.SetFormat("/dev/a", "xfs")
	for dev, want := range map[string]string{"/dev/a": "xfs", "/dev/blank": ""} {
		got, err := f.DiskFormat(testCtx(), dev)
		if err != nil || got != want {
			t.Errorf("DiskFormat(%s) = %q, %v; want %q", dev, got, err, want)
		}
	}
	// blkid failing otherwise (exit 4: usage or I/O error) is an error, not
	// "blank": a blank answer would let the device be formatted.
	tools.Fail("blkid", testingexec.FakeExitError{Status: 4})
	if got, err := f.DiskFormat(testCtx(), "/dev/a"); err == nil {
		t.Errorf("DiskFormat with blkid failing = %q, nil; want an error", got)
	}
	everyCommandHadContext(t, tools)
}

func TestMountPointAndCleanup(t *testing.T) {
	dir := t.TempDir()
	staged := filepath.Join(dir, "staged")
	published := filepath.Join(dir, "published")
	plain := filepath.Join(dir, "plain")
	for _, p := range []string{staged, published, plain} {
		if err := os.Mkdir(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	m := mount.NewFakeMounter([]mount.MountPoint{
		{Device: "/dev/vg1/lv1", Path: staged, Type: "ext4"},
		{Device: "/dev/vg1/lv1", Path: published, Type: "ext4", Opts: []string{"ro"}},
		{Device: "/dev/vg1/lv2", Path: "/elsewhere", Type: "xfs"},
	})
	tools := fstest.New()
	f := New(m, tools)

	mp, err := f.MountPoint(staged)
	if err != nil || mp == nil || mp.Device != "/dev/vg1/lv1" {
		t.Fatalf("MountPoint(staged) = %+v, %v", mp, err)
	}
	for _, p := range []string{plain, filepath.Join(dir, "missing")} {
		if mp, err := f.MountPoint(p); err != nil || mp != nil {
			t.Errorf("MountPoint(%s) = %+v, %v; want nil", p, mp, err)
		}
	}
	refs, err := f.MountsOf("/dev/vg1/lv1")
	if err != nil || !reflect.DeepEqual(refs, []string{staged, published}) {
		t.Errorf("MountsOf = %v, %v", refs, err)
	}

	for _, p := range []string{published, published, plain, filepath.Join(dir, "missing")} {
		if err := f.Cleanup(testCtx(), p); err != nil {
			t.Errorf("Cleanup(%s): %v", p, err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Cleanup(%s) left the path: %v", p, err)
		}
	}
	if mp, _ := f.MountPoint(staged); mp == nil {
		t.Error("Cleanup of another path unmounted the staging path")
	}
	if refs, _ := f.MountsOf("/dev/vg1/lv1"); !reflect.DeepEqual(refs, []string{staged}) {
		t.Errorf("after cleanup MountsOf = %v", refs)
	}
}

// With the host mounter, cleaning up a directory that is not a mount point
// removes it without running umount (umount would fail: "not mounted").
func TestHostMounterCleanupOfPlainDirectory(t *testing.T) {
	tools := fstest.New()
	f := New(NewHostMounter(tools), tools)
	dir := filepath.Join(t.TempDir(), "staging")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := f.Cleanup(testCtx(), dir); err != nil {
			t.Fatalf("Cleanup %d: %v", i, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("directory left: %v", err)
	}
	if calls := tools.Calls(); len(calls) != 0 {
		t.Errorf("ran %v on a directory that is not a mount point", calls)
	}
}

func TestResize(t *testing.T) {
	cases := []struct {
		format string
		want   []string
	}{
		{"ext4", []string{"resize2fs", "/dev/vg1/lv1"}},
		{"xfs", []string{"xfs_growfs", "-d", "/mnt/x"}},
		{"btrfs", []string{"btrfs", "filesystem", "resize", "max", "/mnt/x"}},
	}
	for _, tc := range cases {
		t.Run(tc.format, func(t *testing.T) {
			tools := fstest.New()
			tools.SetFormat("/dev/vg1/lv1", tc.format)
			f := New(mount.NewFakeMounter(nil), tools)
			ok, err := f.Resize(testCtx(), "/dev/vg1/lv1", "/mnt/x")
			if err != nil || !ok {
				t.Fatalf("Resize = %t, %v", ok, err)
			}
			if got := tools.Ran(tc.want[0]); len(got) != 1 || !reflect.DeepEqual(got[0], tc.want) {
				t.Errorf("ran %v, want %v", got, tc.want)
			}
			everyCommandHadContext(t, tools)
		})
	}
	t.Run("grow fails", func(t *testing.T) {
		tools := fstest.New()
		tools.SetFormat("/dev/vg1/lv1", "ext4")
		tools.Fail("resize2fs", testingexec.FakeExitError{Status: 1})
		if _, err := New(mount.NewFakeMounter(nil), tools).Resize(testCtx(), "/dev/vg1/lv1", "/mnt/x"); err == nil {
			t.Error("Resize succeeded although resize2fs failed")
		}
	})
}

func TestDeviceSize(t *testing.T) {
	tools := fstest.New()
	tools.SetSize("/dev/vg1/lv1", 1<<30)
	f := New(mount.NewFakeMounter(nil), tools)
	if got, err := f.DeviceSize(testCtx(), "/dev/vg1/lv1"); err != nil || got != 1<<30 {
		t.Errorf("DeviceSize = %d, %v", got, err)
	}
	if got, err := f.DeviceSize(testCtx(), "/dev/missing"); err == nil {
		t.Errorf("DeviceSize of a missing device = %d, nil", got)
	}
	everyCommandHadContext(t, tools)
}

func TestStats(t *testing.T) {
	f := New(mount.NewFakeMounter(nil), fstest.New())
	s, err := f.Stats(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if s.TotalBytes <= 0 || s.AvailableBytes < 0 || s.UsedBytes < 0 || s.AvailableBytes > s.TotalBytes ||
		s.UsedBytes > s.TotalBytes || s.UsedInodes != s.TotalInodes-s.FreeInodes {
		t.Errorf("implausible stats %+v", s)
	}
	if _, err := f.Stats(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Stats of a missing path succeeded")
	}
}

// HostMounter runs mount and umount itself, under the request's context:
// check the argv it builds.
func TestHostMounterCommands(t *testing.T) {
	src := t.TempDir()
	cases := []struct {
		name    string
		source  string
		fsType  string
		options []string
		want    [][]string
	}{
		{"filesystem", "/dev/vg1/lv1", "xfs", []string{"nouuid", "noatime"},
			[][]string{{"mount", "-t", "xfs", "-o", "nouuid,noatime", "/dev/vg1/lv1", "/t"}}},
		{"bind", src, "", []string{"bind"},
			[][]string{{"mount", "-o", "bind", src, "/t"}, {"mount", "-o", "bind,remount", src, "/t"}}},
		{"read-only bind", src, "", []string{"bind", "ro"},
			[][]string{{"mount", "-o", "bind", src, "/t"}, {"mount", "-o", "bind,remount,ro", src, "/t"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tools := fstest.New()
			h := NewHostMounter(tools)
			m := h.WithContext(testCtx())
			if err := m.Mount(tc.source, "/t", tc.fsType, tc.options); err != nil {
				t.Fatal(err)
			}
			got := tools.Calls()
			// The remount repeats the source filesystem's nosuid/nodev/
			// noexec, which depend on where the test runs: compare the rest.
			for i := range got {
				if len(got[i]) > 2 && got[i][1] == "-o" {
					got[i][2] = trimFlags(got[i][2])
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ran %v, want %v", got, tc.want)
			}
			everyCommandHadContext(t, tools)
		})
	}
	t.Run("umount", func(t *testing.T) {
		tools := fstest.New()
		if err := NewHostMounter(tools).WithContext(testCtx()).Unmount("/t"); err != nil {
			t.Fatal(err)
		}
		if got := tools.Calls(); !reflect.DeepEqual(got, [][]string{{"umount", "/t"}}) {
			t.Errorf("ran %v", got)
		}
		everyCommandHadContext(t, tools)
	})
	t.Run("bind source that cannot be read", func(t *testing.T) {
		// statfs fails: an error naming the source, and nothing mounted
		// (a remount without the source's flags would fail on a locked
		// mount with a message that hides the cause).
		tools := fstest.New()
		missing := filepath.Join(t.TempDir(), "gone")
		err := NewHostMounter(tools).WithContext(testCtx()).Mount(missing, "/t", "", []string{"bind", "ro"})
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "statfs") || !strings.Contains(err.Error(), missing) {
			t.Errorf("Mount of a missing bind source = %v, want a statfs error naming it", err)
		}
		if got := tools.Calls(); len(got) != 0 {
			t.Errorf("ran %v, want nothing", got)
		}
	})
	t.Run("mount fails", func(t *testing.T) {
		tools := fstest.New()
		tools.Fail("mount", testingexec.FakeExitError{Status: 32})
		if err := NewHostMounter(tools).WithContext(testCtx()).Mount("/dev/x", "/t", "ext4", nil); err == nil {
			t.Error("Mount succeeded although mount failed")
		}
	})
}

// A bind mount whose remount fails (the read-only step, or the request's
// deadline between the two) is undone, under a context of its own: a
// retry finds nothing mounted instead of a read-write mount.
func TestHostMounterUndoesAHalfMadeBind(t *testing.T) {
	src := t.TempDir()
	for _, tc := range []struct {
		name        string
		cancelFirst bool
		umountFails bool
		msg         string
	}{
		{name: "remount fails", msg: "the bind mount was undone"},
		{name: "the request's context ends between the two steps", cancelFirst: true, msg: "the bind mount was undone"},
		{name: "the undo fails too", umountFails: true, msg: "mounted without its options"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tools := fstest.New()
			ctx, cancel := context.WithCancel(testCtx())
			defer cancel()
			tools.FailIf(func(argv []string) bool {
				if len(argv) > 2 && strings.Contains(argv[2], "remount") {
					if tc.cancelFirst {
						cancel()
					}
					return true
				}
				return false
			}, testingexec.FakeExitError{Status: 32})
			if tc.umountFails {
				tools.Fail("umount", testingexec.FakeExitError{Status: 32})
			}
			err := NewHostMounter(tools).WithContext(ctx).Mount(src, "/t", "", []string{"bind", "ro"})
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Mount = %v, want an error saying %q", err, tc.msg)
			}
			calls := tools.Calls()
			if len(calls) != 3 || !reflect.DeepEqual(calls[2], []string{"umount", "/t"}) {
				t.Fatalf("ran %v, want bind, remount, umount /t", calls)
			}
			if err := tools.ContextErrors()[2]; err != nil {
				t.Errorf("the undo ran under an ended context: %v", err)
			}
		})
	}
}

func trimFlags(opts string) string {
	var keep []string
	for _, o := range strings.Split(opts, ",") {
		if o != "nosuid" && o != "nodev" && o != "noexec" {
			keep = append(keep, o)
		}
	}
	return strings.Join(keep, ",")
}

func TestSameDevice(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "dm-3")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "vg-lv")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		a, b string
		want bool
	}{
		{"/dev/vg/lv", "/dev/vg/lv", true},
		{link, target, true},
		{"/dev/vg/lv", "/dev/vg/other", false},
	}
	for _, tc := range cases {
		if got := SameDevice(tc.a, tc.b); got != tc.want {
			t.Errorf("SameDevice(%s, %s) = %t, want %t", tc.a, tc.b, got, tc.want)
		}
	}
	// Regular files are not device nodes.
	if SameDeviceNode(target, target) {
		t.Error("SameDeviceNode is true for a regular file")
	}
}

// The mount checks read the mount table and look up carve's own paths
// only: an entry that a stat of its mount point (or source) would equate
// with carve's path or device must not match, since the kernel prints
// canonical paths and stat'ing another pod's mount (a hung NFS) would
// hang carve.
func TestMountChecksDoNotStatOtherMounts(t *testing.T) {
	dir := t.TempDir()
	staging := filepath.Join(dir, "staging")
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	// Links that only a stat would follow: to the staging path, and to
	// the "device" (/dev/null stands for carve's device node: every
	// machine has it, and only its device numbers matter here).
	toStaging, toDevice := filepath.Join(dir, "link-to-staging"), filepath.Join(dir, "link-to-device")
	for link, target := range map[string]string{toStaging: staging, toDevice: "/dev/null"} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("MountPoint", func(t *testing.T) {
		cases := []struct {
			name    string
			entries []mount.MountPoint
			want    string // Device of the entry found, "" for none
		}{
			{name: "an entry whose mount point links to the staging path is another mount",
				entries: []mount.MountPoint{{Device: "server:/export", Path: toStaging, Type: "nfs"}}},
			{name: "an entry on a path that cannot be stat'ed is skipped",
				entries: []mount.MountPoint{{Device: "server:/export", Path: "/unreachable/hung", Type: "nfs"},
					{Device: "/dev/vg/lv", Path: staging, Type: "ext4"}}, want: "/dev/vg/lv"},
			{name: "the staging path itself",
				entries: []mount.MountPoint{{Device: "/dev/vg/lv", Path: staging, Type: "ext4"},
					{Device: "server:/export", Path: toStaging, Type: "nfs"}}, want: "/dev/vg/lv"},
			{name: "a deleted mount point as the kernel prints it",
				entries: []mount.MountPoint{{Device: "/dev/vg/lv", Path: staging + `\040(deleted)`, Type: "ext4"}}, want: "/dev/vg/lv"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				f := New(mount.NewFakeMounter(tc.entries), fstest.New())
				mp, err := f.MountPoint(staging)
				if err != nil {
					t.Fatal(err)
				}
				got := ""
				if mp != nil {
					got = mp.Device
				}
				if got != tc.want {
					t.Errorf("MountPoint(staging) = %+v, want the entry of %q", mp, tc.want)
				}
			})
		}
	})

	t.Run("MountsOf", func(t *testing.T) {
		// /dev/null is 1:3 and /dev/zero 1:5 on every Linux machine; 0:6
		// stands for devtmpfs, mounted whole at /dev.
		const table = `20 1 0:6 / /dev rw - devtmpfs udev rw
30 1 1:3 / /var/lib/kubelet/staging/ours rw - ext4 /dev/mapper/vg-lv rw
31 1 1:3 / /var/lib/kubelet/pods/a/volumes/ours rw - ext4 /dev/mapper/vg-lv rw
32 1 0:6 /null /var/lib/kubelet/pods/b/volumeDevices/ours rw - devtmpfs udev rw
40 1 0:50 / %s rw - nfs %s rw
41 1 0:6 /zero %s rw - devtmpfs udev rw
42 1 0:51 / /var/lib/kubelet/pods/c/volumes/theirs rw - fuse.sshfs %s rw
`
		info := filepath.Join(dir, "mountinfo")
		// 40: an NFS mount whose mount point links to the device; 41: a
		// bind of /dev/zero on a path linking to the device; 42: a FUSE
		// mount whose source links to the device. A stat of any of them
		// would call them the device's.
		content := fmt.Sprintf(table, toDevice, toDevice, toDevice, toDevice)
		if err := os.WriteFile(info, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		tools := fstest.New()
		h := NewHostMounter(tools)
		h.mountInfoPath = info
		got, err := New(h, tools).MountsOf("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"/var/lib/kubelet/staging/ours", "/var/lib/kubelet/pods/a/volumes/ours", "/var/lib/kubelet/pods/b/volumeDevices/ours"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("MountsOf = %v, want %v", got, want)
		}
	})
}

func TestValidateMkfsOptions(t *testing.T) {
	cases := []struct {
		name    string
		fsType  string
		options []string
		wantErr string // "" for valid
	}{
		{name: "xfs default", fsType: "xfs", options: DefaultMkfsOptions("xfs")},
		{name: "ext4 default", fsType: "ext4", options: DefaultMkfsOptions("ext4")},
		{name: "btrfs default", fsType: "btrfs", options: DefaultMkfsOptions("btrfs")},
		{name: "none", fsType: "xfs"},
		{name: "xfs features and sizes", fsType: "xfs", options: []string{"-m", "reflink=0,rmapbt=1", "-b", "size=4096", "-d", "agcount=8"}},
		{name: "ext4 features and extended options", fsType: "ext4", options: []string{"-O", "^metadata_csum_seed,fast_commit", "-E", "lazy_itable_init=0,nodiscard", "-i", "16384", "-T", "largefile"}},
		{name: "xfs external log device", fsType: "xfs", options: []string{"-l", "logdev=/dev/sdb"}, wantErr: `[1] "logdev=/dev/sdb" (value of -l): option "logdev"`},
		{name: "xfs data on another file", fsType: "xfs", options: []string{"-d", "name=/etc/passwd"}, wantErr: `option "name"`},
		{name: "ext4 populated from a host directory", fsType: "ext4", options: []string{"-d", "/etc"}, wantErr: `[0] "-d": not an allowed flag of mkfs.ext4`},
		{name: "ext4 superblock only", fsType: "ext4", options: []string{"-S"}, wantErr: `"-S": not an allowed flag`},
		{name: "ext4 journal on another device", fsType: "ext4", options: []string{"-J", "device=/dev/sdb"}, wantErr: `option "device"`},
		{name: "flag and value in one item", fsType: "xfs", options: []string{"-m bigtime=0"}, wantErr: "each flag and its value are separate items"},
		{name: "flag without its value", fsType: "xfs", options: []string{"-K", "-m"}, wantErr: `[1] "-m": needs a value`},
		{name: "value with a path", fsType: "xfs", options: []string{"-b", "size=/x"}, wantErr: `its value "/x"`},
		{name: "ext4 number with junk", fsType: "ext4", options: []string{"-i", "1;rm"}, wantErr: "must be a number"},
		{name: "feature with a space", fsType: "ext4", options: []string{"-O", "a b"}, wantErr: `feature "a b"`},
		{name: "unknown filesystem", fsType: "zfs", options: nil, wantErr: "must be one of ext4, xfs, btrfs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateMkfsOptions(tc.fsType, tc.options)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("ValidateMkfsOptions(%s, %q) = %v, want nil", tc.fsType, tc.options, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("ValidateMkfsOptions(%s, %q) = %v, want an error with %q", tc.fsType, tc.options, err, tc.wantErr)
			}
		})
	}
}

// TestProbeReplay: the signature is read once per FormatAndMount, by one
// blkid, whatever follows (mkfs, or fsck and mount); a later call reads
// it again.
func TestProbeReplay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		format string // what blkid finds on the device
		calls  int
		mkfs   int
	}{
		{name: "leftover data without a signature: one blkid, then mkfs", calls: 1, mkfs: 1},
		{name: "a filesystem: one blkid, then fsck and mount", format: "ext4", calls: 1},
		{name: "each call reads the device again", format: "ext4", calls: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not a file: ReadsBlank cannot read it, and blkid decides.
			const dev = "/dev/vg1/lv1"
			tools := fstest.New()
			tools.SetFormat(dev, tc.format)
			f := New(mount.NewFakeMounter(nil), tools)
			for i := 0; i < tc.calls; i++ {
				if _, err := f.FormatAndMount(testCtx(), dev, filepath.Join(t.TempDir(), "t"), "ext4", nil, nil, func(string) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
			if n := len(tools.Ran("blkid")); n != tc.calls {
				t.Errorf("blkid ran %d times in %d calls, want one each", n, tc.calls)
			}
			if n := len(tools.Ran("mkfs.ext4")); n != tc.mkfs {
				t.Errorf("mkfs ran %d times, want %d", n, tc.mkfs)
			}
			everyCommandHadContext(t, tools)
		})
	}
}
