//go:build hosttest

package host

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// TestLoopVGCleanup: the fixture the root tiers, the end-to-end harness and
// the demo stand on leaves nothing behind, even with LVs in the VG and a
// PV detached, and its lvm.conf hides every other device.
func TestLoopVGCleanup(t *testing.T) {
	lvmtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	v, err := lvmtest.Create(ctx, lvmtest.Options{Dir: dir, Name: lvmtest.UniqueName("carveclean"), Size: 128 * mib, PVs: 2})
	if err != nil {
		t.Fatal(err)
	}
	other := lvmtest.New(t, lvmtest.Options{Size: 64 * mib})

	if _, err := v.LVM(ctx, "lvcreate", "--yes", "--name", "lv", "--extents", "100%FREE", v.Name); err != nil {
		t.Fatal(err)
	}
	// Each fixture sees only its own VG.
	out, err := v.LVM(ctx, "vgs", "--noheadings", "-o", "vg_name")
	if err != nil || strings.TrimSpace(string(out)) != v.Name {
		t.Errorf("vgs under the fixture's lvm.conf = %q (%v), want only %s", out, err, v.Name)
	}
	if strings.Contains(string(out), other.Name) {
		t.Errorf("fixture %s sees %s", v.Name, other.Name)
	}
	if err := v.DetachPV(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for _, f := range v.Files {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("backing file %s still there (%v)", f, err)
		}
	}
	if _, err := os.Stat(v.ConfigDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("config dir %s still there (%v)", v.ConfigDir, err)
	}
	list, err := exec.CommandContext(ctx, "losetup", "--list", "--noheadings", "--output", "BACK-FILE").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range v.Files {
		if strings.Contains(string(list), f) {
			t.Errorf("a loop device still holds %s:\n%s", f, list)
		}
	}
}
