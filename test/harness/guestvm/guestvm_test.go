package guestvm

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpioEntry is one entry read back from a newc archive.
type cpioEntry struct {
	name         string
	mode         uint32
	rmaj, rmin   uint32
	data         string
	headerOffset int
}

// readCPIO parses a newc archive the way the kernel does, checking the
// alignment rules on the way.
func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+6+8*i+8]), 16, 32)
		if err != nil {
			t.Fatalf("bad header field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	for {
		if off%4 != 0 {
			t.Fatalf("header at %d is not 4-byte aligned", off)
		}
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, b[off:off+6])
		}
		mode, size, rmaj, rmin, namesize := field(1), field(6), field(9), field(10), field(11)
		nameStart := off + 110
		name := string(b[nameStart : nameStart+int(namesize)-1])
		if b[nameStart+int(namesize)-1] != 0 {
			t.Fatalf("name %q not NUL-terminated", name)
		}
		dataStart := (nameStart + int(namesize) + 3) &^ 3
		e := cpioEntry{name: name, mode: mode, rmaj: rmaj, rmin: rmin, data: string(b[dataStart : dataStart+int(size)]), headerOffset: off}
		off = (dataStart + int(size) + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, e)
	}
}

func TestCPIOWriter(t *testing.T) {
	var buf bytes.Buffer
	c := newCPIOWriter(&buf)
	c.Dir("/bin", 0o755)
	c.File("bin/a", 0o755, []byte("x"))   // data needing padding
	c.File("ab", 0o644, []byte("1234"))   // aligned data
	c.File("empty", 0o600, nil)           // no data
	c.Symlink("bin/sh", "busybox")        // symlink target as data
	c.CharDev("dev/console", 0o600, 5, 1) // device numbers
	c.File("long-name-x", 0o644, []byte("abcdefg"))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	got := readCPIO(t, buf.Bytes())
	want := []cpioEntry{
		{name: "bin", mode: 0o040755},
		{name: "bin/a", mode: 0o100755, data: "x"},
		{name: "ab", mode: 0o100644, data: "1234"},
		{name: "empty", mode: 0o100600},
		{name: "bin/sh", mode: 0o120777, data: "busybox"},
		{name: "dev/console", mode: 0o020600, rmaj: 5, rmin: 1},
		{name: "long-name-x", mode: 0o100644, data: "abcdefg"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		got[i].headerOffset = 0
		if got[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// The first error sticks: later entries are dropped and Close reports it.
	var bad bytes.Buffer
	c = newCPIOWriter(&bad)
	c.File("", 0o644, nil)
	c.File("after", 0o644, []byte("x"))
	if err := c.Close(); err == nil || !strings.Contains(err.Error(), "bad entry name") {
		t.Errorf("an empty name: Close = %v, want the bad entry name error", err)
	}
	if bad.Len() != 0 {
		t.Errorf("%d bytes written after the first error", bad.Len())
	}
}

func TestVersionLess(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"6.1.0-9-amd64", "6.1.0-56-amd64", true},
		{"6.1.0-56-amd64", "6.1.0-9-amd64", false},
		{"5.10.0-30-amd64", "6.1.0-1-amd64", true},
		{"6.1.0-56-amd64", "6.1.0-56-amd64", false},
		{"6.1.0-56-amd64", "6.1.0-56-cloud-amd64", true},
	}
	for _, tt := range tests {
		if got := versionLess(tt.a, tt.b); got != tt.want {
			t.Errorf("versionLess(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

// mkdirAll and writeFile set up fixture trees; a failure ends the test.
func mkdirAll(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

// fakeKernel lays out /boot and /lib/modules trees for the given versions;
// withModules says which versions get a modules.dep.
func fakeKernel(t *testing.T, versions map[string]bool) (boot, mods string) {
	t.Helper()
	root := t.TempDir()
	boot, mods = filepath.Join(root, "boot"), filepath.Join(root, "modules")
	mkdirAll(t, boot)
	for v, withModules := range versions {
		writeFile(t, filepath.Join(boot, "vmlinuz-"+v), []byte("k"), 0o644)
		if withModules {
			dir := filepath.Join(mods, v)
			mkdirAll(t, dir)
			writeFile(t, filepath.Join(dir, "modules.dep"), []byte(fakeModulesDep), 0o644)
			writeFile(t, filepath.Join(dir, "modules.builtin"), []byte("kernel/drivers/virtio/virtio_builtin.ko\n"), 0o644)
		}
	}
	return boot, mods
}

const fakeModulesDep = `kernel/fs/overlayfs/overlay.ko:
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko
kernel/net/9p/9pnet.ko:
kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko
kernel/fs/netfs/netfs.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/md/dm-mod.ko:
kernel/fs/xz/thing.ko.xz:
`

func TestFindKernel(t *testing.T) {
	tests := []struct {
		name     string
		versions map[string]bool
		want     string
		wantErr  string
	}{
		{name: "newest with modules", versions: map[string]bool{"6.1.0-9-amd64": true, "6.1.0-56-amd64": true}, want: "6.1.0-56-amd64"},
		{name: "image without modules is ignored", versions: map[string]bool{"6.1.0-9-amd64": true, "6.1.0-60-amd64": false}, want: "6.1.0-9-amd64"},
		{name: "none", versions: map[string]bool{"6.1.0-60-amd64": false}, wantErr: "linux-image-amd64"},
		{name: "empty", versions: map[string]bool{}, wantErr: "linux-image-amd64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			boot, mods := fakeKernel(t, tt.versions)
			k, err := FindKernel(boot, mods)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("FindKernel = %+v, %v, want an error naming %s", k, err, tt.wantErr)
				}
				return
			}
			if err != nil || k.Version != tt.want || k.Image != filepath.Join(boot, "vmlinuz-"+tt.want) || k.ModulesDir != filepath.Join(mods, tt.want) {
				t.Fatalf("FindKernel = %+v, %v, want version %s", k, err, tt.want)
			}
		})
	}
}

func TestResolveModules(t *testing.T) {
	boot, mods := fakeKernel(t, map[string]bool{"6.1.0-1-amd64": true})
	k, err := FindKernel(boot, mods)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		in      []string
		want    []string
		wantErr string
	}{
		{
			name: "dependencies first, each once",
			in:   []string{"9pnet_virtio", "9p", "overlay"},
			want: []string{"kernel/drivers/virtio/virtio_ring.ko", "kernel/net/9p/9pnet.ko", "kernel/net/9p/9pnet_virtio.ko",
				"kernel/fs/netfs/netfs.ko", "kernel/fs/fscache/fscache.ko", "kernel/fs/9p/9p.ko", "kernel/fs/overlayfs/overlay.ko"},
		},
		{name: "dash and underscore are the same", in: []string{"dm_mod"}, want: []string{"kernel/drivers/md/dm-mod.ko"}},
		{name: "builtin is skipped", in: []string{"virtio_builtin", "overlay"}, want: []string{"kernel/fs/overlayfs/overlay.ko"}},
		{name: "unknown", in: []string{"nosuch"}, wantErr: "nosuch is not in"},
		{name: "compressed", in: []string{"thing"}, wantErr: "compressed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := k.ResolveModules(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ResolveModules = %v, %v, want error %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ResolveModules = %v, %v\nwant %v", got, err, tt.want)
			}
		})
	}
}

func TestInitramfsCache(t *testing.T) {
	boot, mods := fakeKernel(t, map[string]bool{"6.1.0-1-amd64": true})
	k, _ := FindKernel(boot, mods)
	for _, m := range []string{"kernel/drivers/virtio/virtio_ring.ko", "kernel/net/9p/9pnet.ko", "kernel/net/9p/9pnet_virtio.ko",
		"kernel/fs/netfs/netfs.ko", "kernel/fs/fscache/fscache.ko", "kernel/fs/9p/9p.ko", "kernel/fs/overlayfs/overlay.ko"} {
		mkdirAll(t, filepath.Join(k.ModulesDir, filepath.Dir(m)))
		writeFile(t, filepath.Join(k.ModulesDir, m), []byte("ko:"+m), 0o644)
	}
	// virtio_pci is not in the fake tree: give it an entry of its own.
	dep, err := os.ReadFile(filepath.Join(k.ModulesDir, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(k.ModulesDir, "modules.dep"), append(dep, "kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_ring.ko\n"...), 0o644)
	writeFile(t, filepath.Join(k.ModulesDir, "kernel/drivers/virtio/virtio_pci.ko"), []byte("ko:pci"), 0o644)
	busybox := filepath.Join(t.TempDir(), "busybox")
	writeFile(t, busybox, []byte("bb"), 0o755)
	cache := t.TempDir()

	first, err := Initramfs(k, cache, busybox)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, filepath.Join(cache, "guest", k.Version+"-")) || filepath.Base(first) != "initramfs.cpio.gz" {
		t.Errorf("initramfs at %s, want under %s/guest/%s-<hash>/", first, cache, k.Version)
	}
	st1, _ := os.Stat(first)
	again, err := Initramfs(k, cache, busybox)
	st2, _ := os.Stat(again)
	if err != nil || again != first || !st2.ModTime().Equal(st1.ModTime()) {
		t.Errorf("second Initramfs = %s, %v; want the cached %s reused", again, err, first)
	}
	// A changed input gives a new image.
	writeFile(t, busybox, []byte("bb2"), 0o755)
	if err := os.Chtimes(busybox, time.Now().Add(time.Hour), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	changed, err := Initramfs(k, cache, busybox)
	if err != nil || changed == first {
		t.Errorf("Initramfs after busybox changed = %s, %v; want a new path", changed, err)
	}

	// The image holds init, busybox, /dev/console and the modules in load
	// order, and init loads them in that order.
	gz, err := os.ReadFile(changed)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]cpioEntry{}
	for _, e := range readCPIO(t, raw) {
		entries[e.name] = e
	}
	if e := entries["bin/busybox"]; e.data != "bb2" || e.mode != 0o100755 {
		t.Errorf("bin/busybox = %+v", e)
	}
	if e := entries["dev/console"]; e.mode != 0o020600 || e.rmaj != 5 || e.rmin != 1 {
		t.Errorf("dev/console = %+v", e)
	}
	if e := entries["modules/9p.ko"]; e.data != "ko:kernel/fs/9p/9p.ko" {
		t.Errorf("modules/9p.ko = %+v", e)
	}
	init := entries["init"].data
	if i, j := strings.Index(init, "insmod /modules/netfs.ko"), strings.Index(init, "insmod /modules/9p.ko"); i < 0 || j < i {
		t.Errorf("init does not load netfs before 9p:\n%s", init)
	}
	if !strings.Contains(init, "exec switch_root /newroot /bin/sh /carve/.guestvm/run.sh") {
		t.Errorf("init does not hand over to the run script:\n%s", init)
	}
}

func TestShellQuote(t *testing.T) {
	tests := map[string]string{
		"plain":        "'plain'",
		"":             "''",
		"it's":         `'it'\''s'`,
		"$HOME `x` \\": "'$HOME `x` \\'",
		"a\nb":         "'a\nb'",
	}
	for in, want := range tests {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	ok := Spec{WorkDir: "/w", Args: []string{"/bin/true"}}
	tests := []struct {
		name    string
		edit    func(*Spec)
		wantErr string
	}{
		{name: "minimal", edit: func(*Spec) {}},
		{name: "no work dir", edit: func(s *Spec) { s.WorkDir = "" }, wantErr: "WorkDir"},
		{name: "no command", edit: func(s *Spec) { s.Args = nil }, wantErr: "Args"},
		{name: "NUL in argument", edit: func(s *Spec) { s.Args = append(s.Args, "a\x00b") }, wantErr: "NUL"},
		{name: "bad env key", edit: func(s *Spec) { s.Env = []string{"A-B=1"} }, wantErr: "Env"},
		{name: "env without =", edit: func(s *Spec) { s.Env = []string{"AB"} }, wantErr: "Env"},
		{name: "good env", edit: func(s *Spec) { s.Env = []string{"A_1=x y'z"} }},
		{name: "bad module", edit: func(s *Spec) { s.Modules = []string{"dm_mod; reboot"} }, wantErr: "Modules"},
		{name: "file escapes", edit: func(s *Spec) { s.Files = []File{{Name: "../x", Data: []byte{}}} }, wantErr: "clean relative"},
		{name: "absolute file", edit: func(s *Spec) { s.Files = []File{{Name: "/x", Data: []byte{}}} }, wantErr: "clean relative"},
		{name: "control dir", edit: func(s *Spec) { s.Files = []File{{Name: ".guestvm/run.sh", Data: []byte{}}} }, wantErr: "clean relative"},
		{name: "file with both", edit: func(s *Spec) { s.Files = []File{{Name: "x", Source: "/a", Data: []byte{}}} }, wantErr: "exactly one"},
		{name: "file with neither", edit: func(s *Spec) { s.Files = []File{{Name: "x"}} }, wantErr: "exactly one"},
		{name: "forward to loopback", edit: func(s *Spec) { s.Forwards = []Forward{{GuestPort: 6443, HostAddr: "127.0.0.1:6443"}} }},
		{name: "forward elsewhere", edit: func(s *Spec) { s.Forwards = []Forward{{GuestPort: 6443, HostAddr: "10.1.1.1:6443"}} }, wantErr: "loopback"},
		{name: "forward without port", edit: func(s *Spec) { s.Forwards = []Forward{{HostAddr: "127.0.0.1:1"}} }, wantErr: "guest port"},
		{name: "host forward to loopback", edit: func(s *Spec) { s.HostForwards = []HostForward{{HostAddr: "127.0.0.1:20250", GuestPort: 10250}} }},
		{name: "host forward on every address", edit: func(s *Spec) { s.HostForwards = []HostForward{{HostAddr: "0.0.0.0:20250", GuestPort: 10250}} }, wantErr: "loopback"},
		{name: "relative disk", edit: func(s *Spec) { s.Disks = []string{"disk.img"} }, wantErr: "absolute"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.edit(&s)
			err := s.validate()
			if tt.wantErr == "" && err != nil {
				t.Fatalf("validate = %v, want nil", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("validate = %v, want an error about %s", err, tt.wantErr)
			}
		})
	}
}

func TestRunScriptAndQemuArgs(t *testing.T) {
	s := Spec{WorkDir: "/tmp/w,1", Args: []string{GuestPath("x.test"), "-test.run", "A|B"}, Env: []string{"K=v'1"},
		Modules: []string{"dm_crypt"}, Forwards: []Forward{{GuestPort: 80, HostAddr: "127.0.0.1:8080"}},
		HostForwards: []HostForward{{HostAddr: "127.0.0.1:20250", GuestPort: 10250}}, Disks: []string{"/d/a,b.img", "/d/c.img"}}
	s.defaults()
	script := runScript(s)
	wantContains(t, script, "run script lacks %q:\n%s",
		"export K='v'\\''1'",
		"'/carve/x.test' '-test.run' 'A|B' > /carve/.guestvm/stdout 2> /carve/.guestvm/stderr < /dev/null",
		"modprobe dm_crypt ||",
		"modprobe virtio_net ||",
		"modprobe virtio_blk ||",
		"ip route add default via 10.0.2.2",
		"DM_DISABLE_UDEV=1",
		"echo o > /proc/sysrq-trigger",
	)
	args := strings.Join(qemuArgs(s, Kernel{Image: "/boot/vmlinuz-v"}, "/c/i.gz"), " ")
	wantContains(t, args, "qemu args lack %q: %s",
		"-accel tcg,thread=multi -cpu max -smp 2 -m 2048",
		"-no-reboot",
		"path=/,mount_tag=hostroot,security_model=none,readonly=on",
		"path=/tmp/w,,1,mount_tag=carvework",
		"guestfwd=tcp:10.0.2.100:80-cmd:socat - TCP:127.0.0.1:8080",
		"hostfwd=tcp:127.0.0.1:20250-10.0.2.15:10250",
		"-drive file=/d/a,,b.img,format=raw,if=virtio,cache=unsafe,index=0",
		"-drive file=/d/c.img,format=raw,if=virtio,cache=unsafe,index=1",
		"restrict=on",
	)
	if strings.Contains(args, "kvm") {
		t.Errorf("qemu args use KVM, which hangs on these machines: %s", args)
	}
}

func TestPlaceFile(t *testing.T) {
	src := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(src, []byte("binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		file     File
		wantData string
		wantMode os.FileMode
	}{
		{name: "data", file: File{Name: "conf/a.yaml", Data: []byte("k: v")}, wantData: "k: v", wantMode: 0o644},
		{name: "source, default mode", file: File{Name: "bin/x", Source: src}, wantData: "binary", wantMode: 0o755},
		{name: "source, same mode", file: File{Name: "y", Source: src, Mode: 0o700}, wantData: "binary", wantMode: 0o700},
	}
	work := t.TempDir()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Twice: a file left by an earlier run is replaced.
			for i := 0; i < 2; i++ {
				if err := placeFile(work, tt.file); err != nil {
					t.Fatal(err)
				}
			}
			dst := filepath.Join(work, tt.file.Name)
			b, err := os.ReadFile(dst)
			st, _ := os.Stat(dst)
			if err != nil || string(b) != tt.wantData || st.Mode().Perm() != tt.wantMode {
				t.Errorf("%s = %q mode %v, %v; want %q mode %v", dst, b, st.Mode().Perm(), err, tt.wantData, tt.wantMode)
			}
		})
	}
	if st, _ := os.Stat(src); st.Mode().Perm() != 0o700 {
		t.Errorf("placing changed the source's mode to %v", st.Mode().Perm())
	}
}

// wantContains fails t, with format (of the missing string and s), for
// each of wants that s lacks.
func wantContains(t *testing.T, s, format string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(s, want) {
			t.Errorf(format, want, s)
		}
	}
}
