// Package lvmtest makes throwaway LVM volume groups on loop devices: sparse
// backing files, loop devices, an lvm.conf of their own (LVM_SYSTEM_DIR)
// that scans only those devices and turns activation on or off, and a
// cleanup that removes all of it. The host and guest test tiers use it
// through New (cleanup registered with t.Cleanup); the end-to-end harness
// and `make demo` use Create / NewLoopVG and Close, outside any test.
//
// It runs lvm and losetup directly (exec, no shell) and does not depend on
// carve's lvm package, so that package's own tests can use it.
package lvmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// commandTimeout bounds each command the fixture runs when the caller's
// context has no deadline.
const commandTimeout = time.Minute

// Options describe a volume group to make.
type Options struct {
	// Dir holds the backing files and the LVM configuration directory;
	// required (a test's t.TempDir(), a harness's work directory).
	Dir string
	// Name is the volume group name; required.
	Name string
	// Size is the total size of the backing files in bytes, split evenly
	// across the PVs; default 1 GiB.
	Size int64
	// PVs is the number of physical volumes (loop devices); default 1.
	PVs int
	// Activation turns LVM activation on. Without device-mapper (the host)
	// it must be off: lvm.conf then says global/activation=0 and LVM does
	// metadata-only work. In the guest it is on, with udev sync and
	// dmeventd monitoring off (the guest runs neither).
	Activation bool
	// ExtentSize, when set, is the VG's extent size in bytes (vgcreate -s);
	// default LVM's 4 MiB.
	ExtentSize int64
}

// LoopVG is a volume group on loop devices made by this package.
type LoopVG struct {
	// Name is the volume group name.
	Name string
	// ConfigDir is the LVM_SYSTEM_DIR holding this VG's lvm.conf.
	ConfigDir string
	// Devices are the loop devices, one per PV, in order.
	Devices []string
	// Files are the backing files of Devices.
	Files []string
	// Activation is whether LVM activation is on.
	Activation bool

	mu       sync.Mutex
	detached map[int]bool
	closed   bool
}

// Check returns an error saying what is missing when this machine cannot
// make loop volume groups: root, lvm, losetup.
func Check() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (loop devices and LVM need uid 0; run `sudo make test-host`)")
	}
	for _, cmd := range []string{"lvm", "losetup"} {
		if _, err := exec.LookPath(cmd); err != nil {
			missing = append(missing, cmd+" (not in PATH; `make deps` installs lvm2 and util-linux)")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("lvmtest cannot make loop volume groups here, missing: %s", strings.Join(missing, "; "))
	}
	return nil
}

// NewLoopVG makes a volume group name of size bytes on one loop device with
// its files under dir. Close removes everything.
func NewLoopVG(ctx context.Context, dir, name string, size int64, activation bool) (*LoopVG, error) {
	return Create(ctx, Options{Dir: dir, Name: name, Size: size, Activation: activation})
}

var vgNameRE = regexp.MustCompile(`^[a-zA-Z0-9+_.][a-zA-Z0-9+_.-]{0,126}$`)

// Create makes the volume group that opts describe. On failure whatever was
// made is removed again.
func Create(ctx context.Context, opts Options) (*LoopVG, error) {
	if opts.Dir == "" || !vgNameRE.MatchString(opts.Name) {
		return nil, fmt.Errorf("lvmtest: Dir is required and Name must be a VG name, got Dir=%q Name=%q", opts.Dir, opts.Name)
	}
	if opts.Size == 0 {
		opts.Size = 1 << 30
	}
	if opts.PVs <= 0 {
		opts.PVs = 1
	}
	if err := Check(); err != nil {
		return nil, err
	}
	v := &LoopVG{
		Name:       opts.Name,
		ConfigDir:  filepath.Join(opts.Dir, opts.Name+"-lvm"),
		Activation: opts.Activation,
		detached:   map[int]bool{},
	}
	if err := v.create(ctx, opts); err != nil {
		if cerr := v.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
		}
		return nil, err
	}
	return v, nil
}

func (v *LoopVG) create(ctx context.Context, opts Options) error {
	if err := os.MkdirAll(v.ConfigDir, 0o755); err != nil {
		return err
	}
	// Each PV gets a whole number of MiB.
	per := (opts.Size/int64(opts.PVs) + (1<<20 - 1)) &^ (1<<20 - 1)
	for i := 0; i < opts.PVs; i++ {
		file := filepath.Join(opts.Dir, fmt.Sprintf("%s-pv%d.img", opts.Name, i))
		f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(per) // sparse: no blocks are written
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		v.Files = append(v.Files, file)
		out, err := run(ctx, nil, "losetup", "--find", "--show", file)
		if err != nil {
			return err
		}
		v.Devices = append(v.Devices, strings.TrimSpace(string(out)))
	}
	if err := v.writeConfig(); err != nil {
		return err
	}
	if _, err := v.LVM(ctx, append([]string{"pvcreate", "--yes"}, v.Devices...)...); err != nil {
		return err
	}
	args := []string{"vgcreate", "--yes"}
	if opts.ExtentSize > 0 {
		args = append(args, "--physicalextentsize", strconv.FormatInt(opts.ExtentSize, 10)+"b")
	}
	args = append(args, v.Name)
	_, err := v.LVM(ctx, append(args, v.Devices...)...)
	return err
}

// writeConfig writes lvm.conf: only the fixture's attached loop devices are
// scanned (so parallel tests and the machine's own disks stay out of view,
// and hints and the devices file cannot hide ours), and activation is on or
// off as asked.
func (v *LoopVG) writeConfig() error {
	var filter []string
	for i, d := range v.Devices {
		if !v.detached[i] {
			filter = append(filter, fmt.Sprintf("%q", "a|^"+regexp.QuoteMeta(d)+"$|"))
		}
	}
	filter = append(filter, `"r|.*|"`)
	activation := 0
	if v.Activation {
		activation = 1
	}
	conf := fmt.Sprintf(`# Written by carve's test/harness/lvmtest for volume group %s.
devices {
	global_filter = [ %s ]
	use_devicesfile = 0
	obtain_device_list_from_udev = 0
	hints = "none"
	scan_lvs = 0
}
global {
	activation = %d
}
activation {
	udev_sync = 0
	udev_rules = 0
	monitoring = 0
}
`, v.Name, strings.Join(filter, ", "), activation)
	return os.WriteFile(filepath.Join(v.ConfigDir, "lvm.conf"), []byte(conf), 0o644)
}

// Env is the environment that points LVM at this VG's configuration; pass it
// as lvm.Options.Env.
func (v *LoopVG) Env() []string { return []string{"LVM_SYSTEM_DIR=" + v.ConfigDir} }

// LVM runs `lvm args...` against this VG's configuration and returns its
// stdout; a failure carries stderr. Tests use it for raw commands (setup,
// benchmarks against the raw command).
func (v *LoopVG) LVM(ctx context.Context, args ...string) ([]byte, error) {
	return run(ctx, v.Env(), "lvm", args...)
}

// Command returns the *exec.Cmd of `lvm args...` with this VG's
// environment, for callers that time or drive the process themselves.
func (v *LoopVG) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "lvm", args...)
	cmd.Env = commandEnv(v.Env())
	return cmd
}

// CreateThinPool makes a thin pool of size bytes in the VG (needs
// activation, so the guest).
func (v *LoopVG) CreateThinPool(ctx context.Context, name string, size int64) error {
	_, err := v.LVM(ctx, "lvcreate", "--yes", "--type", "thin-pool", "--name", name,
		"--size", strconv.FormatInt(size, 10)+"b", v.Name)
	return err
}

// DetachPV detaches the loop device of PV i, so that LVM sees the VG with a
// missing PV. The device leaves the filter too: a loop device of that number
// made later by someone else must not be scanned as ours.
func (v *LoopVG) DetachPV(ctx context.Context, i int) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if i < 0 || i >= len(v.Devices) || v.detached[i] {
		return fmt.Errorf("lvmtest: no attached PV %d", i)
	}
	if _, err := run(ctx, nil, "losetup", "--detach", v.Devices[i]); err != nil {
		return err
	}
	v.detached[i] = true
	return v.writeConfig()
}

// Close removes the VG (whatever LVs it holds), its PVs, the loop devices,
// the backing files and the configuration. It is safe to call more than
// once and tries every step even when one fails.
func (v *LoopVG) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil
	}
	v.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	var attached []string
	for i, d := range v.Devices {
		if !v.detached[i] {
			attached = append(attached, d)
		}
	}
	if len(attached) > 0 && v.configured() {
		if len(v.detached) > 0 {
			// A VG with a missing PV cannot be removed until it is dropped.
			if _, err := v.LVM(ctx, "vgreduce", "--removemissing", "--force", v.Name); err != nil {
				errs = append(errs, err)
			}
		}
		if _, err := v.LVM(ctx, "vgremove", "--force", "--force", "--yes", v.Name); err != nil && !vgGone(err) {
			errs = append(errs, err)
		}
		if _, err := v.LVM(ctx, append([]string{"pvremove", "--force", "--force", "--yes"}, attached...)...); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range attached {
		if _, err := run(ctx, nil, "losetup", "--detach", d); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range v.Files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(v.ConfigDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (v *LoopVG) configured() bool {
	_, err := os.Stat(filepath.Join(v.ConfigDir, "lvm.conf"))
	return err == nil
}

// vgGone tells a vgremove of a VG that was never made (a Create that failed
// early) from a real failure.
func vgGone(err error) bool {
	var ce *CommandError
	return errors.As(err, &ce) && strings.Contains(ce.Stderr, "not found")
}

// CommandError is a failed command with its stderr.
type CommandError struct {
	Args   []string
	Stderr string
	Err    error
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.Args, " "), e.Err, strings.TrimSpace(e.Stderr))
}

func (e *CommandError) Unwrap() error { return e.Err }

func commandEnv(extra []string) []string {
	return append(append(os.Environ(), "LC_ALL=C", "LVM_SUPPRESS_FD_WARNINGS=1"), extra...)
}

func run(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, commandTimeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = commandEnv(env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &CommandError{Args: append([]string{name}, args...), Stderr: stderr.String(), Err: err}
	}
	return stdout.Bytes(), nil
}
