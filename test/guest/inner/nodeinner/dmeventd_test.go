//go:build guestinner

package nodeinner

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// dmeventds lists the process IDs of the dmeventd processes running.
func dmeventds(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, de := range entries {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", de.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == "dmeventd" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// setMonitoring sets activation/monitoring in the env's lvm.conf (lvmtest
// writes 0).
func (e *env) setMonitoring(t *testing.T, on bool) {
	t.Helper()
	conf := filepath.Join(e.vg.ConfigDir, "lvm.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	from, to := "monitoring = 0", "monitoring = 1"
	if !on {
		from, to = to, from
	}
	if !strings.Contains(string(b), from) {
		t.Fatalf("%s has no %q:\n%s", conf, from, b)
	}
	if err := os.WriteFile(conf, []byte(strings.Replace(string(b), from, to, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCarveStartsNoDmeventd: the node's container does not share the
// host's /run, so an lvm that activates something dmeventd monitors (a
// thin pool, a copy-on-write snapshot) starts a dmeventd of its own in the
// container, unless monitoring is off (review N12). carve's lvm commands
// carry activation/monitoring=0: on a volume group whose lvm.conf leaves
// monitoring on (LVM's default), a thick volume, its copy-on-write
// snapshot, and a thin volume whose pool carve's lvcreate activates start
// no dmeventd. The control: a raw lvchange that activates the pool with
// the same lvm.conf starts one.
func TestCarveStartsNoDmeventd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvWith(t, "dmeventd", 512*mib, snapClasses)
	e.stop()
	if err := e.vg.CreateThinPool(ctx, "pool0", 128*mib); err != nil {
		t.Fatal(err)
	}
	// Inactive, so that carve's thin lvcreate activates it.
	if _, err := e.vg.LVM(ctx, "lvchange", "--activate", "n", e.vg.Name+"/pool0"); err != nil {
		t.Fatal(err)
	}
	if pids := dmeventds(t); len(pids) != 0 {
		t.Fatalf("dmeventd runs before the test (%v): the test could not tell who started it", pids)
	}
	e.setMonitoring(t, true)
	t.Cleanup(func() { e.setMonitoring(t, false) }) // before the VG is removed
	e.start()

	id := e.createInClass("monitored-origin", 32*mib, blockCapability(), class)
	e.snapshot("monitored-snap", id)
	// The pool's own LV stays inactive (lv_attr twi---tz--); its -tpool
	// device comes up with the thin LV.
	thin := e.createInClass("monitored-thin", 32*mib, blockCapability(), "thin")
	if attr := e.lvAttr(lvName(t, thin)); attr[4] != 'a' {
		t.Fatalf("the thin volume is not active after CreateVolume (lv_attr %s)", attr)
	}
	if pids := dmeventds(t); len(pids) != 0 {
		t.Errorf("carve's lvm commands started dmeventd (pids %v)", pids)
	}

	// The control: a snapshot the test makes with the same lvm.conf.
	if _, err := e.vg.LVM(ctx, "lvcreate", "--yes", "--snapshot", "--name", "control-snap", "--size", "8m", e.vg.Name+"/"+lvName(t, id)); err != nil {
		t.Fatal(err)
	}
	pids := dmeventds(t)
	if len(pids) == 0 {
		t.Error("the control started no dmeventd either: this test cannot tell")
	}
	if _, err := e.vg.LVM(ctx, "lvremove", "--yes", e.vg.Name+"/control-snap"); err != nil {
		t.Error(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Errorf("stopping the control's dmeventd %d: %v", pid, err)
		}
	}
	t.Logf("the control's lvcreate of a snapshot started dmeventd %v", pids)
}
