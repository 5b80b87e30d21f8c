//go:build record

package lvm

// Records the JSON reports and failures that the unit tests parse, from
// real lvm2 on loop devices, with the package's own command lines:
//
//	sudo go test -tags record -run TestRecord -v ./internal/node/lvm/
//
// Thin pools need device-mapper, so TestRecordThin runs only where
// activation works (the guest); elsewhere it fails. The files land in
// testdata/ and are committed; re-record them when the fields change.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// recordDir is where recordings go; CARVE_RECORD_DIR overrides it (the
// guest's view of the tree is read-only).
func recordDir() string {
	if d := os.Getenv("CARVE_RECORD_DIR"); d != "" {
		return d
	}
	return "testdata"
}

type recorder struct {
	t   *testing.T
	env []string
	// failures collects failed commands: name -> exit code and stderr.
	failures map[string]recordedFailure
}

type recordedFailure struct {
	Args     []string `json:"args"`
	ExitCode int      `json:"exitCode"`
	Stderr   string   `json:"stderr"`
}

func (r *recorder) run(args []string) output {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := execRunner{command: "lvm", env: commandEnv(r.env)}.run(ctx, args)
	if err != nil {
		r.t.Fatalf("lvm %v: %v", args, err)
	}
	return out
}

// save runs args, which must succeed, and writes stdout to testdata/name.
func (r *recorder) save(name string, args []string) {
	r.t.Helper()
	out := r.run(args)
	if out.ExitCode != 0 {
		r.t.Fatalf("lvm %v: exit %d: %s", args, out.ExitCode, out.Stderr)
	}
	if err := os.WriteFile(filepath.Join(recordDir(), name), out.Stdout, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// must runs a setup command that must succeed.
func (r *recorder) must(args ...string) {
	r.t.Helper()
	if out := r.run(args); out.ExitCode != 0 {
		r.t.Fatalf("lvm %v: exit %d: %s", args, out.ExitCode, out.Stderr)
	}
}

// fail runs args, which must fail, and keeps exit code and stderr.
func (r *recorder) fail(name string, args []string) {
	r.t.Helper()
	out := r.run(args)
	if out.ExitCode == 0 {
		r.t.Fatalf("lvm %v succeeded, a failure was to be recorded", args)
	}
	r.failures[name] = recordedFailure{Args: args, ExitCode: out.ExitCode, Stderr: scrubDevices(string(out.Stderr))}
}

func (r *recorder) saveFailures(file string) {
	b, err := json.MarshalIndent(r.failures, "", "  ")
	if err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(recordDir(), file), append(b, '\n'), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

var loopRE = regexp.MustCompile(`/dev/loop[0-9]+`)

func scrubDevices(s string) string { return loopRE.ReplaceAllString(s, "/dev/loopN") }

// joinConfig writes an lvm.conf that scans the devices of all vgs, so that
// one report shows several VGs.
func joinConfig(t *testing.T, vgs ...*lvmtest.LoopVG) []string {
	dir := t.TempDir()
	conf, err := os.ReadFile(filepath.Join(vgs[0].ConfigDir, "lvm.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var accept []string
	for _, v := range vgs {
		for _, d := range v.Devices {
			accept = append(accept, `"a|^`+d+`$|"`)
		}
	}
	filter := "global_filter = [ " + strings.Join(accept, ", ") + `, "r|.*|" ]`
	out := regexp.MustCompile(`global_filter = \[.*\]`).ReplaceAllString(string(conf), filter)
	if err := os.WriteFile(filepath.Join(dir, "lvm.conf"), []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"LVM_SYSTEM_DIR=" + dir}
}

func TestRecordHost(t *testing.T) {
	thick := lvmtest.New(t, lvmtest.Options{Name: "rec-thick", Size: 1 << 30, PVs: 2})
	empty := lvmtest.New(t, lvmtest.Options{Name: "rec-empty", Size: 256 << 20})
	r := &recorder{t: t, env: joinConfig(t, thick, empty), failures: map[string]recordedFailure{}}

	const vg = "rec-thick"
	tagged := CreateRequest{VolumeGroup: vg, Name: "carve-aaaa", Size: 10 << 20,
		Tags: []string{"carve.dev/owner=carve", "carve.dev/volume=7076632d31", "carve.dev/class=fast"}}
	r.must(createArgs(tagged, 12<<20)...)
	r.must(createArgs(CreateRequest{VolumeGroup: vg, Name: "plain", Size: 4 << 20}, 4<<20)...)
	striped := CreateRequest{VolumeGroup: vg, Name: "striped", Size: 8 << 20,
		Tags: []string{"carve.dev/owner=carve"}, Options: LVOptions{Stripes: 2, StripeSize: 64 << 10}}
	r.must(createArgs(striped, 8<<20)...)

	r.save("fullreport-thick.json", fullReportArgs())
	r.save("vgs.json", vgsArgs(vg))
	r.save("vgs-none.json", vgsArgs("nosuchvg"))
	r.save("lvs-get.json", lvsArgs(false, "-S", `lv_name="carve-aaaa"`, vg))
	r.save("lvs-get-none.json", lvsArgs(false, "-S", `lv_name="nosuchlv"`, vg))
	r.save("lvs-list.json", lvsArgs(true, vg))
	r.save("lvs-tag.json", lvsArgs(false, "@carve.dev/owner=carve"))

	r.fail("create-exists", createArgs(tagged, 12<<20))
	r.fail("create-no-vg", createArgs(CreateRequest{VolumeGroup: "nosuchvg", Name: "x"}, 4<<20))
	r.fail("create-no-space", createArgs(CreateRequest{VolumeGroup: vg, Name: "big"}, 4<<30))
	r.fail("create-stripes-pvs", createArgs(CreateRequest{VolumeGroup: vg, Name: "s3", Options: LVOptions{Stripes: 3}}, 12<<20))
	r.fail("create-bad-name", createArgs(CreateRequest{VolumeGroup: vg, Name: "snapshot0"}, 4<<20))
	r.fail("extend-no-space", extendArgs(vg, "plain", 4<<30))
	r.fail("extend-no-lv", extendArgs(vg, "nosuchlv", 8<<20))
	r.fail("remove-no-lv", removeArgs(vg, "nosuchlv"))
	r.fail("remove-no-vg", removeArgs("nosuchvg", "x"))
	r.fail("lvs-no-vg", lvsArgs(false, "-S", `lv_name="x"`, "nosuchvg"))
	r.saveFailures("failures-host.json")

	emptyOnly := &recorder{t: t, env: empty.Env(), failures: map[string]recordedFailure{}}
	emptyOnly.save("fullreport-empty.json", fullReportArgs())
}

func TestRecordMissingPV(t *testing.T) {
	v := lvmtest.New(t, lvmtest.Options{Name: "rec-partial", Size: 512 << 20, PVs: 2})
	r := &recorder{t: t, env: v.Env(), failures: map[string]recordedFailure{}}
	// "whole" fills the first PV and spills onto the second; "first" lies
	// on the first PV only.
	r.must("lvcreate", "--yes", "--name", "first", "--size", "8m", "--addtag", "carve.dev/owner=carve", "rec-partial", v.Devices[0])
	r.must("lvcreate", "--yes", "--name", "whole", "--extents", "100%FREE", "rec-partial")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := v.DetachPV(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r.save("fullreport-missing-pv.json", fullReportArgs())
}

// TestRecordThin records a thin pool with thin LVs and a thin snapshot; it
// needs activation (device-mapper), so it runs in the guest.
func TestRecordThin(t *testing.T) {
	if _, err := os.Stat("/dev/mapper/control"); err != nil {
		t.Fatal(errors.New("thin pools need device-mapper (/dev/mapper/control); record in the guest"))
	}
	v := lvmtest.New(t, lvmtest.Options{Name: "rec-thin", Size: 1 << 30, Activation: true})
	r := &recorder{t: t, env: v.Env(), failures: map[string]recordedFailure{}}
	const vg = "rec-thin"
	r.must("lvcreate", "--yes", "--type", "thin-pool", "--name", "pool0", "--size", "256m", vg)
	r.must(createArgs(CreateRequest{VolumeGroup: vg, Name: "thin1", ThinPool: "pool0",
		Tags: []string{"carve.dev/owner=carve"}}, 64<<20)...)
	r.must(createArgs(CreateRequest{VolumeGroup: vg, Name: "thin2", ThinPool: "pool0"}, 512<<20)...)
	r.must(createArgs(CreateRequest{VolumeGroup: vg, Name: "thick1"}, 8<<20)...)
	r.must(snapshotArgs(SnapshotRequest{VolumeGroup: vg, Origin: "thin1", Name: "snap1", Tags: []string{"carve.dev/owner=carve"}}, 0)...)
	// Some data in the pool, so that data_percent is not zero.
	f, err := os.OpenFile("/dev/"+vg+"/thin1", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	if _, err := f.Write(buf); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r.save("fullreport-thin.json", fullReportArgs())
	r.save("lvs-thin-list.json", lvsArgs(true, vg))
	r.fail("thin-create-no-pool", createArgs(CreateRequest{VolumeGroup: vg, Name: "t9", ThinPool: "nopool"}, 4<<20))
	r.fail("snapshot-exists", snapshotArgs(SnapshotRequest{VolumeGroup: vg, Origin: "thin1", Name: "snap1"}, 0))
	r.saveFailures("failures-thin.json")
}
