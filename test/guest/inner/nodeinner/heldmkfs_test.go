//go:build guestinner

package nodeinner

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// heldMkfsName is the tool a held mkfs stands in for.
const heldMkfsName = "mkfs.ext4"

// heldMkfsGate names the held mkfs's directory in its environment: it
// notes each run in runs and waits until release exists there.
const heldMkfsGate = "CARVE_TEST_HELD_MKFS_GATE"

// heldMkfsReal names the real mkfs.ext4 in a held mkfs's environment.
const heldMkfsReal = "CARVE_TEST_HELD_MKFS_REAL"

// TestMain lets this test binary stand in for mkfs.ext4 when it runs
// under that name (heldMkfs); otherwise it runs the tests.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == heldMkfsName {
		fmt.Fprintln(os.Stderr, runHeldMkfs())
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// runHeldMkfs notes the run, waits until the test releases it, then
// becomes the real mkfs.ext4 with the same arguments. It returns only on
// error.
func runHeldMkfs() error {
	gate, tool := os.Getenv(heldMkfsGate), os.Getenv(heldMkfsReal)
	if gate == "" || tool == "" {
		return fmt.Errorf("held %s: %s and %s must be set", heldMkfsName, heldMkfsGate, heldMkfsReal)
	}
	f, err := os.OpenFile(filepath.Join(gate, "runs"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, strings.Join(os.Args[1:], " "))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	for {
		if _, err := os.Stat(filepath.Join(gate, "release")); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return syscall.Exec(tool, append([]string{heldMkfsName}, os.Args[1:]...), os.Environ())
}

// heldMkfs is an mkfs.ext4 that waits until the test releases it: a
// plugin started with its env runs it instead of the real one, so a
// stage's mkfs lasts exactly as long as the test wants.
type heldMkfs struct {
	t    *testing.T
	gate string
	// tool is the real mkfs.ext4.
	tool string
}

// newHeldMkfs makes the held mkfs.ext4 (this test binary under that
// name) in a directory of its own.
func newHeldMkfs(t *testing.T) *heldMkfs {
	t.Helper()
	tool, err := exec.LookPath(heldMkfsName)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := &heldMkfs{t: t, gate: t.TempDir(), tool: tool}
	if err := os.Symlink(self, filepath.Join(h.gate, heldMkfsName)); err != nil {
		t.Fatal(err)
	}
	return h
}

// env is what a plugin needs to run the held mkfs: its directory first
// in PATH.
func (h *heldMkfs) env() []string {
	return []string{"PATH=" + h.gate + string(os.PathListSeparator) + os.Getenv("PATH"),
		heldMkfsGate + "=" + h.gate, heldMkfsReal + "=" + h.tool}
}

// release lets every held and later mkfs run; releasing again does
// nothing.
func (h *heldMkfs) release() {
	h.t.Helper()
	if err := os.WriteFile(filepath.Join(h.gate, "release"), nil, 0o600); err != nil {
		h.t.Fatal(err)
	}
}

// runs is how often mkfs.ext4 was started.
func (h *heldMkfs) runs() int {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.gate, "runs"))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}
