// Package guestvm boots a throw-away qemu guest (TCG) with Debian's own
// kernel and the host's root filesystem shared read-only beneath a tmpfs
// overlay, runs one command in it with real device-mapper, loop devices and
// filesystems, and returns the command's output and exit status. It exists
// because the host kernel has no device-mapper (see TESTBED.md).
//
// A run has a work directory on the host, shared read-write at
// GuestWorkDir: the files of Spec.Files are put there before boot (binaries,
// configuration), and the command may leave results there.
package guestvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// File is one file to place in the work directory before the guest boots.
type File struct {
	// Name is the path relative to the work directory (the guest sees it at
	// GuestPath(Name)).
	Name string
	// Source is a host file to copy (hard-linked when possible). Exactly
	// one of Source and Data is set.
	Source string
	// Data is the file's contents, for small files such as configuration.
	Data []byte
	// Mode is the file's permission bits; 0 means 0755 for Source (binaries)
	// and 0644 for Data.
	Mode os.FileMode
}

// Forward makes a TCP listener on this host reachable from the
// guest at GuestForwardIP:GuestPort (qemu user-mode networking with
// guestfwd, restrict=on so the guest reaches nothing else).
type Forward struct {
	GuestPort int
	// HostAddr is a host:port on this host (loopback or a local
	// interface's address), e.g. 127.0.0.1:6443.
	HostAddr string
}

// GuestForwardIP is the address the guest uses for the Forwards.
const GuestForwardIP = "10.0.2.100"

// GuestIP is the guest's own address on its network interface, the target
// of HostForwards.
const GuestIP = "10.0.2.15"

// HostForward makes a guest TCP port reachable on the host's loopback
// (qemu hostfwd).
type HostForward struct {
	// HostAddr is the loopback host:port qemu listens on, e.g.
	// 127.0.0.1:10250.
	HostAddr string
	// GuestPort is the port at GuestIP it leads to.
	GuestPort int
}

// Spec describes one guest run.
type Spec struct {
	// WorkDir is the host directory shared read-write with the guest at
	// GuestWorkDir (e.g. a test's TempDir). Required.
	WorkDir string
	// Files are put into WorkDir before boot.
	Files []File
	// Args is the command to run; Args[0] is a path in the guest, e.g.
	// GuestPath("inner.test") or "/usr/sbin/lvm".
	Args []string
	// Env holds KEY=value pairs added to the command's environment (which
	// already has PATH, HOME, LC_ALL=C and DM_DISABLE_UDEV=1).
	Env []string
	// Dir is the command's working directory in the guest; default
	// GuestWorkDir.
	Dir string
	// Modules are loaded with modprobe before the command, in addition to
	// dm_mod, dm_thin_pool, dm_snapshot and loop (which every guest gets).
	// A module that does not exist fails the run.
	Modules []string
	// Forwards, when set, give the guest a network interface (eth0,
	// GuestIP) that reaches only these host listeners. Each connection
	// gets its own socat process on the host, so a forward carries any
	// number of connections.
	Forwards []Forward
	// HostForwards, when set, also give the guest its network interface,
	// and make these guest ports reachable from the host.
	HostForwards []HostForward
	// Disks are raw image files on the host attached as virtio disks, in
	// order /dev/vda, /dev/vdb, ... They persist across runs: a second run
	// with the same files sees what the first wrote.
	Disks []string

	// Timeout bounds the whole run, boot included; default 10 minutes.
	Timeout time.Duration
	// BootTimeout bounds the time until the command starts; default 2
	// minutes.
	BootTimeout time.Duration
	// MemoryMiB is the guest's memory; default 2048.
	MemoryMiB int
	// CPUs is the number of virtual CPUs; default 2.
	CPUs int

	// Stdout and Stderr, when set, receive the command's output while it
	// runs (it is returned in the Result as well).
	Stdout, Stderr io.Writer
	// Console, when set, receives the guest's serial console: kernel
	// messages and the guest's init (returned in the Result as well).
	Console io.Writer

	// CacheDir holds the built initramfs; default DefaultCacheDir().
	CacheDir string
	// BootDir and ModulesRoot locate the kernel; default /boot and
	// /lib/modules.
	BootDir, ModulesRoot string
}

// defaultModules are loaded in every guest when the kernel has them:
// device-mapper with the thin and snapshot targets, and loop devices. Other
// targets (raid, mirror) and filesystems load on demand: the kernel's module
// autoloader runs the host's modprobe inside the guest.
var defaultModules = []string{"dm_mod", "dm_thin_pool", "dm_snapshot", "loop"}

// Result is what a run produced.
type Result struct {
	// ExitCode is the command's exit status in the guest.
	ExitCode int
	// Stdout, Stderr and Console are everything that was written to them.
	Stdout, Stderr, Console []byte
	// BootTime is the time from starting qemu until the command started
	// (measured on the host, to about 50 ms).
	BootTime time.Duration
	// Duration is the whole run, qemu start to exit.
	Duration time.Duration
	// Kernel is the kernel version that ran.
	Kernel string
}

// GuestPath returns the path in the guest of a file of the work directory.
func GuestPath(name string) string { return path.Join(GuestWorkDir, name) }

// DefaultCacheDir is $CARVE_CACHE (the Makefile exports it), else
// $HOME/.cache/carve.
func DefaultCacheDir() string {
	if d := os.Getenv("CARVE_CACHE"); d != "" {
		return d
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "carve")
	}
	return filepath.Join(os.TempDir(), "carve-cache")
}

func (s *Spec) defaults() {
	if s.Timeout == 0 {
		s.Timeout = 10 * time.Minute
	}
	if s.BootTimeout == 0 {
		s.BootTimeout = 2 * time.Minute
	}
	if s.MemoryMiB == 0 {
		s.MemoryMiB = 2048
	}
	if s.CPUs == 0 {
		s.CPUs = 2
	}
	if s.Dir == "" {
		s.Dir = GuestWorkDir
	}
	if s.CacheDir == "" {
		s.CacheDir = DefaultCacheDir()
	}
	if s.BootDir == "" {
		s.BootDir = "/boot"
	}
	if s.ModulesRoot == "" {
		s.ModulesRoot = "/lib/modules"
	}
}

var (
	envKeyRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	moduleRE    = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	errNoStatus = errors.New("guest ended without reporting the command's exit status")
)

func (s *Spec) validate() error {
	if s.WorkDir == "" {
		return errors.New("guestvm: Spec.WorkDir is required")
	}
	if len(s.Args) == 0 || s.Args[0] == "" {
		return errors.New("guestvm: Spec.Args must name a command")
	}
	for _, a := range append(append([]string{s.Dir}, s.Args...), s.Env...) {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("guestvm: argument %q holds a NUL byte", a)
		}
	}
	for _, e := range s.Env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || !envKeyRE.MatchString(k) {
			return fmt.Errorf("guestvm: Spec.Env entry %q is not KEY=value with KEY of [A-Za-z0-9_]", e)
		}
	}
	for _, m := range s.Modules {
		if !moduleRE.MatchString(m) {
			return fmt.Errorf("guestvm: Spec.Modules entry %q is not a module name", m)
		}
	}
	for _, f := range s.Files {
		clean := path.Clean(f.Name)
		if f.Name == "" || clean != f.Name || path.IsAbs(clean) || clean == "." || strings.HasPrefix(clean, "..") ||
			clean == controlDir || strings.HasPrefix(clean, controlDir+"/") {
			return fmt.Errorf("guestvm: Spec.Files name %q must be a clean relative path outside %s", f.Name, controlDir)
		}
		if (f.Source == "") == (f.Data == nil) {
			return fmt.Errorf("guestvm: Spec.Files %q needs exactly one of Source and Data", f.Name)
		}
	}
	for _, fw := range s.Forwards {
		if err := checkForward(fw.HostAddr, fw.GuestPort); err != nil {
			return fmt.Errorf("guestvm: Spec.Forwards entry %+v: %w", fw, err)
		}
	}
	for _, fw := range s.HostForwards {
		if err := checkForward(fw.HostAddr, fw.GuestPort); err != nil {
			return fmt.Errorf("guestvm: Spec.HostForwards entry %+v: %w", fw, err)
		}
	}
	for _, d := range s.Disks {
		if !filepath.IsAbs(d) || strings.ContainsRune(d, 0) {
			return fmt.Errorf("guestvm: Spec.Disks entry %q must be an absolute path", d)
		}
	}
	return nil
}

// checkForward accepts a guest port and a host:port on one of this host's
// own addresses (loopback, or an address of a local interface such as the
// test bed's node-channel address): nothing a guest forwards may listen
// on, or reach, anything but this host.
func checkForward(hostAddr string, guestPort int) error {
	host, _, err := net.SplitHostPort(hostAddr)
	if err != nil || guestPort <= 0 || guestPort > 65535 {
		return errors.New("need a guest port and a host:port")
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return fmt.Errorf("host address %q must be an IP of this host", hostAddr)
	}
	if ip.IsLoopback() {
		return nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("this host's addresses: %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return nil
		}
	}
	return fmt.Errorf("host address %q must be a loopback IP or an address of this host", hostAddr)
}

// networked tells whether the guest gets a network interface.
func (s *Spec) networked() bool { return len(s.Forwards) > 0 || len(s.HostForwards) > 0 }

// Run boots a guest, runs spec.Args in it and returns its output and exit
// status. A command that exits non-zero is not an error: check
// Result.ExitCode. An error means the command's status is unknown: qemu or
// the guest failed, the boot or run timed out, or ctx was cancelled; the
// error then carries the end of the console output.
func Run(ctx context.Context, spec Spec) (Result, error) {
	spec.defaults()
	if err := spec.validate(); err != nil {
		return Result{}, err
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return Result{}, fmt.Errorf("guestvm: qemu-system-x86_64 not found: install the Debian package qemu-system-x86 (hack/install-deps.sh does): %w", err)
	}
	if len(spec.Forwards) > 0 {
		if _, err := exec.LookPath("socat"); err != nil {
			return Result{}, fmt.Errorf("guestvm: socat not found (qemu runs it for every forwarded connection): install the Debian package socat (hack/install-deps.sh does): %w", err)
		}
	}
	kernel, err := FindKernel(spec.BootDir, spec.ModulesRoot)
	if err != nil {
		return Result{}, err
	}
	busybox, err := findBusybox("/bin/busybox", "/usr/bin/busybox")
	if err != nil {
		return Result{}, err
	}
	initrd, err := Initramfs(kernel, spec.CacheDir, busybox)
	if err != nil {
		return Result{}, err
	}
	ctl := filepath.Join(spec.WorkDir, controlDir)
	if err := prepareWorkDir(spec, ctl); err != nil {
		return Result{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	args := qemuArgs(spec, kernel, initrd)
	cmd := exec.CommandContext(ctx, qemu, args...)
	var console, qemuErr syncBuffer
	cmd.Stdout = teeTo(&console, spec.Console)
	cmd.Stderr = &qemuErr
	cmd.WaitDelay = 5 * time.Second
	// If this process dies (a go test timeout panics), qemu must not live
	// on. Its own process group keeps a terminal's Ctrl-C (meant for the
	// harness, which then stops the guest in order) from killing it first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}

	var stdout, stderr syncBuffer
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Result{}, fmt.Errorf("guestvm: starting qemu: %w", err)
	}
	// Watch the guest: stream the command's output files and time the
	// boot. The guest writes straight into the shared directory, so the
	// files grow while the command runs.
	res := Result{Kernel: kernel.Version}
	bootTimedOut := false
	done := make(chan struct{})
	var wg sync.WaitGroup
	var tailErr error // read after wg.Wait
	wg.Add(1)
	go func() {
		defer wg.Done()
		out := newTail(filepath.Join(ctl, "stdout"), teeTo(&stdout, spec.Stdout))
		errs := newTail(filepath.Join(ctl, "stderr"), teeTo(&stderr, spec.Stderr))
		defer func() { tailErr = errors.Join(out.close(), errs.close()) }()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				out.poll()
				errs.poll()
				return
			case <-tick.C:
			}
			if res.BootTime == 0 {
				if _, err := os.Stat(filepath.Join(ctl, "started")); err == nil {
					res.BootTime = time.Since(start)
				} else if time.Since(start) > spec.BootTimeout {
					bootTimedOut = true
					// Kill our own qemu by its pid; Wait below reports
					// how it ended, so the error here adds nothing.
					cmd.Process.Kill() //nolint:errcheck // Wait below reports how it ended
				}
			}
			out.poll()
			errs.poll()
		}
	}()
	waitErr := cmd.Wait()
	close(done)
	wg.Wait()
	res.Duration = time.Since(start)
	res.Stdout, res.Stderr, res.Console = stdout.Bytes(), stderr.Bytes(), console.Bytes()

	status, statusErr := os.ReadFile(filepath.Join(ctl, "exit-status"))
	switch {
	case bootTimedOut:
		err = fmt.Errorf("guestvm: the guest did not start the command within %s", spec.BootTimeout)
	case ctx.Err() != nil && statusErr != nil:
		err = fmt.Errorf("guestvm: run stopped before the command finished (Spec.Timeout %s): %w", spec.Timeout, ctx.Err())
	case statusErr != nil:
		err = errNoStatus
		if waitErr != nil {
			err = fmt.Errorf("%w (qemu: %v)", errNoStatus, waitErr) //nolint:errorlint // errNoStatus is what callers test for; qemu's exit is context
		}
	default:
		code, perr := strconv.Atoi(strings.TrimSpace(string(status)))
		if perr != nil {
			err = fmt.Errorf("guestvm: bad exit status file %q", status)
			break
		}
		res.ExitCode = code
		if tailErr != nil {
			return res, fmt.Errorf("guestvm: reading the command's output: %w", tailErr)
		}
		return res, nil
	}
	return res, fmt.Errorf("%w\nqemu stderr: %s\nconsole (last lines):\n%s", err,
		strings.TrimSpace(qemuErr.String()), lastLines(res.Console, 30))
}

// qemuArgs is the command line of TESTBED.md section 2: TCG (a KVM guest
// hangs on these machines), the host root read-only, the work directory
// read-write, no network unless forwards were asked for.
func qemuArgs(spec Spec, k Kernel, initrd string) []string {
	args := []string{
		"-nodefaults", "-no-user-config",
		"-accel", "tcg,thread=multi", "-cpu", "max",
		"-smp", strconv.Itoa(spec.CPUs), "-m", strconv.Itoa(spec.MemoryMiB),
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", k.Image, "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1",
		"-virtfs", "local,path=/,mount_tag=" + hostRootTag + ",security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + qemuEscape(spec.WorkDir) + ",mount_tag=" + workTag + ",security_model=none,multidevs=remap",
	}
	if spec.networked() {
		netdev := "user,id=n0,restrict=on"
		for _, f := range spec.Forwards {
			// A chardev target ("-tcp:") is opened once for qemu's whole
			// life and carries one connection; "cmd:" runs socat per
			// connection. A comma inside the command is doubled.
			host, port, _ := net.SplitHostPort(f.HostAddr)
			netdev += fmt.Sprintf(",guestfwd=tcp:%s:%d-cmd:socat - TCP:%s:%s", GuestForwardIP, f.GuestPort, host, port)
		}
		for _, f := range spec.HostForwards {
			netdev += fmt.Sprintf(",hostfwd=tcp:%s-%s:%d", f.HostAddr, GuestIP, f.GuestPort)
		}
		args = append(args, "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0")
	}
	for i, d := range spec.Disks {
		args = append(args, "-drive", fmt.Sprintf("file=%s,format=raw,if=virtio,cache=unsafe,index=%d", qemuEscape(d), i))
	}
	return args
}

// qemuEscape doubles commas, qemu's escape inside an option value.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// prepareWorkDir puts the files and the run script into the work directory.
func prepareWorkDir(spec Spec, ctl string) error {
	if err := os.MkdirAll(ctl, 0o755); err != nil {
		return fmt.Errorf("guestvm: work directory: %w", err)
	}
	for _, name := range []string{"started", "exit-status"} {
		if err := os.Remove(filepath.Join(ctl, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("guestvm: work directory: %w", err)
		}
	}
	for _, name := range []string{"stdout", "stderr"} {
		if err := os.WriteFile(filepath.Join(ctl, name), nil, 0o644); err != nil {
			return fmt.Errorf("guestvm: work directory: %w", err)
		}
	}
	for _, f := range spec.Files {
		if err := placeFile(spec.WorkDir, f); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(ctl, "run.sh"), []byte(runScript(spec)), 0o755); err != nil {
		return fmt.Errorf("guestvm: work directory: %w", err)
	}
	return nil
}

func placeFile(workDir string, f File) error {
	dst := filepath.Join(workDir, filepath.FromSlash(f.Name))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("guestvm: placing %s: %w", f.Name, err)
	}
	// A file left by an earlier run in the same work directory is replaced
	// (a hard link must not write through to the old file's other name).
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("guestvm: placing %s: %w", f.Name, err)
	}
	mode := f.Mode
	if f.Data != nil {
		if mode == 0 {
			mode = 0o644
		}
		if err := os.WriteFile(dst, f.Data, mode); err != nil {
			return fmt.Errorf("guestvm: placing %s: %w", f.Name, err)
		}
		return nil
	}
	if mode == 0 {
		mode = 0o755
	}
	// A hard link is free, but shares the mode with the source: link only
	// when the mode is already the one asked for, copy otherwise.
	if st, err := os.Stat(f.Source); err == nil && st.Mode().Perm() == mode.Perm() {
		if err := os.Link(f.Source, dst); err == nil {
			return nil
		}
	}
	in, err := os.Open(f.Source)
	if err != nil {
		return fmt.Errorf("guestvm: placing %s: %w", f.Name, err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("guestvm: placing %s: %w", f.Name, errors.Join(err, in.Close()))
	}
	_, err = io.Copy(out, in)
	// A failed Close of the written copy is a lost write.
	if err := errors.Join(err, out.Close(), in.Close()); err != nil {
		return fmt.Errorf("guestvm: placing %s: %w", f.Name, err)
	}
	return nil
}

// runScript is what the guest runs after the chroot into the overlay (with
// the host's /bin/sh): the mounts and modules every run needs, then the
// command with its output in the shared directory, then power-off.
func runScript(spec Spec) string {
	ctl := path.Join(GuestWorkDir, controlDir)
	var b strings.Builder
	b.WriteString(`set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C DM_DISABLE_UDEV=1
echo 1 > /proc/sys/kernel/sysrq
off() { sync; echo o > /proc/sysrq-trigger; sleep 30; }
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
# LVM writes its archives, backups and locks; the overlay makes /etc
# writable, /run is a fresh tmpfs.
mkdir -p /run/lock/lvm /run/lvm /etc/lvm/archive /etc/lvm/backup
`)
	for _, m := range defaultModules {
		fmt.Fprintf(&b, "modprobe -q %s || echo 'guestvm: kernel module %s not available'\n", m, m)
	}
	mods := spec.Modules
	if spec.networked() {
		mods = append(append([]string{}, mods...), "virtio_net")
	}
	if len(spec.Disks) > 0 {
		mods = append(append([]string{}, mods...), "virtio_blk")
	}
	for _, m := range mods {
		fmt.Fprintf(&b, "modprobe %s || { echo 'guestvm: modprobe %s failed'; off; }\n", m, m)
	}
	if spec.networked() {
		// The default route goes to qemu's gateway, which (restrict=on)
		// leads nowhere but the forwards; a kubelet wants one to exist.
		fmt.Fprintf(&b, "ip link set lo up\nip addr add %s/24 dev eth0 && ip link set eth0 up && ip route add default via 10.0.2.2 || { echo 'guestvm: network setup failed'; off; }\n", GuestIP)
	}
	for _, e := range spec.Env {
		k, v, _ := strings.Cut(e, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	fmt.Fprintf(&b, "cd %s || { echo 'guestvm: cannot enter Spec.Dir'; off; }\n", shellQuote(spec.Dir))
	fmt.Fprintf(&b, ": > %s/started\n", ctl)
	quoted := make([]string, len(spec.Args))
	for i, a := range spec.Args {
		quoted[i] = shellQuote(a)
	}
	fmt.Fprintf(&b, "%s > %s/stdout 2> %s/stderr < /dev/null\n", strings.Join(quoted, " "), ctl, ctl)
	fmt.Fprintf(&b, "echo $? > %[1]s/exit-status.tmp && mv %[1]s/exit-status.tmp %[1]s/exit-status\n", ctl)
	b.WriteString("off\n")
	return b.String()
}

// shellQuote quotes s for the guest's sh: inside single quotes nothing is
// special but the single quote itself.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// tail copies what is appended to a file to a writer.
type tail struct {
	path string
	w    io.Writer
	f    *os.File
}

func newTail(path string, w io.Writer) *tail { return &tail{path: path, w: w} }

func (t *tail) poll() {
	if t.f == nil {
		f, err := os.Open(t.path)
		if err != nil {
			return
		}
		t.f = f
	}
	// The first writer is always the Result's buffer, which cannot fail;
	// a failing caller's writer must not stop the run.
	io.Copy(t.w, t.f) //nolint:errcheck // see above: a failing writer must not stop the run
}

func (t *tail) close() error {
	if t.f == nil {
		return nil
	}
	return t.f.Close()
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf.Bytes()...)
}

func (b *syncBuffer) String() string { return string(b.Bytes()) }

func teeTo(buf io.Writer, w io.Writer) io.Writer {
	if w == nil {
		return buf
	}
	return io.MultiWriter(buf, w)
}
