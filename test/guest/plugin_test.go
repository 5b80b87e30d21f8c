//go:build guesttest

package guest

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/guestvm"
)

// The plugin tests run the real `carve plugin` binary inside the guest on
// loop-device volume groups with real device-mapper, mkfs and mount. Each
// host test boots the guest once and runs one inner test package there
// (test/guest/inner/...): the Go code is built here, where it runs about 28
// times faster than under TCG.

// TestPluginSanity runs csi-sanity against the plugin, for a thick and a
// thin default device class, and checks the plugin's metrics afterwards.
func TestPluginSanity(t *testing.T) {
	out := runPluginInner(t, pluginInner{
		pkg:     "./inner/sanityinner",
		run:     "^TestSanity$",
		timeout: 40 * time.Minute,
	})
	for _, want := range []string{"SANITY thick:", "SANITY thin:"} {
		if !strings.Contains(out, want) {
			t.Errorf("the guest printed no %q summary", want)
		}
	}
}

// TestPluginNode runs every node test of test/guest/inner/nodeinner (its
// benchmarks excepted) in one guest, side by side: each test has its own
// volume group and plugin, so they run in parallel on the guest's two
// CPUs. Among them: data safety across a plugin restart, online expansion
// of ext4 and xfs; snapshots (restored data, clones of a volume being
// written, a copy killed mid-way, a full copy-on-write snapshot); and what
// production disks and hosts do to a plugin (a reboot without LVM
// autoactivation, a new raw-block volume on a deleted one's extents, an LV
// left half-made by a crash; the plugin killed at random points of 300
// calls, TestSoakKillPlugin: CARVE_SOAK_OPS sets the length, and
// CARVE_SOAK_SEED replays a schedule). CARVE_NODE_RUN runs only the inner
// tests its -test.run pattern picks (then the soak's figures are not
// required).
func TestPluginNode(t *testing.T) {
	var args []string
	timeout := 25 * time.Minute
	if v := os.Getenv("CARVE_SOAK_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CARVE_SOAK_OPS=%q: want a number of operations", v)
		}
		args = append(args, "-soak-ops", v)
		// About a second a call under TCG beside the other tests, kills
		// and restarts included.
		timeout += time.Duration(n) * time.Second
	}
	if v := os.Getenv("CARVE_SOAK_SEED"); v != "" {
		args = append(args, "-soak-seed", v)
	}
	run := "."
	if v := os.Getenv("CARVE_NODE_RUN"); v != "" {
		run = v
	}
	out := runPluginInner(t, pluginInner{
		pkg:     "./inner/nodeinner",
		run:     run,
		skip:    "^TestBench",
		timeout: timeout,
		args:    args,
	})
	if run == "." && !regexp.MustCompile(`(?m)^SOAK .* leaks found 0,`).MatchString(out) {
		t.Error("the soak printed no figures with leaks found 0")
	}
}

// TestBenchPlugin measures the plugin against the raw commands it wraps
// (make bench). It asserts only that every operation worked; the figures
// are ratios printed for the reader, never timed assertions.
//
// CARVE_BENCH_RUN (make bench BENCH_RUN=...) picks some of the inner
// benchmarks by -test.run pattern, e.g. ^TestBenchNodeStage$.
func TestBenchPlugin(t *testing.T) {
	run := "^TestBench"
	if v := os.Getenv("CARVE_BENCH_RUN"); v != "" {
		run = v
	}
	out := runPluginInner(t, pluginInner{
		pkg:     "./inner/nodeinner",
		run:     run,
		timeout: 20 * time.Minute,
	})
	if n := strings.Count(out, "\nratio carve"); run == "^TestBench" && n != 6 || n == 0 {
		t.Errorf("the guest printed %d of the 6 carve ratio lines", n)
	}
}

// pluginInner is one inner package run.
type pluginInner struct {
	pkg     string // relative to this directory
	run     string // -test.run pattern
	skip    string // -test.skip pattern, if any
	timeout time.Duration
	args    []string // more flags for the inner test binary
}

// runPluginInner builds carve and the inner test package, runs the package
// in a fresh guest, streams its output (so that, as with runInner, the inner
// tests' own --- PASS lines reach hack/summarize-go-test.sh), copies the
// plugin logs and sanity reports to $CARVE_CACHE/guest-artifacts, and fails
// unless the inner tests passed. It returns the inner output.
func runPluginInner(t *testing.T, in pluginInner) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), in.timeout+5*time.Minute)
	defer cancel()
	build := t.TempDir()
	carve := filepath.Join(build, "carve")
	inner := filepath.Join(build, "inner.test")
	start := time.Now()
	if err := guestvm.BuildBinary(ctx, "github.com/carve-csi/carve/cmd/carve", nil, carve); err != nil {
		t.Fatal(err)
	}
	if err := guestvm.BuildTestBinary(ctx, in.pkg, []string{"guestinner"}, inner); err != nil {
		t.Fatal(err)
	}
	t.Logf("built carve and %s in %s", in.pkg, time.Since(start).Round(time.Millisecond))

	args := []string{guestvm.GuestPath("inner.test"),
		"-test.v", "-test.run", in.run, "-test.timeout", in.timeout.String(),
		"-carve", guestvm.GuestPath("carve"),
		"-artifacts", guestvm.GuestPath("artifacts"),
	}
	if in.skip != "" {
		args = append(args, "-test.skip", in.skip)
	}
	args = append(args, in.args...)
	work := t.TempDir()
	var out bytes.Buffer
	stream := io.MultiWriter(os.Stdout, &out)
	res, err := guestvm.Run(ctx, guestvm.Spec{
		WorkDir: work,
		Files: []guestvm.File{
			{Name: "carve", Source: carve},
			{Name: "inner.test", Source: inner},
		},
		Args:    args,
		Timeout: in.timeout + 3*time.Minute,
		// The guest's tmpfs holds the loop files (sparse) and the
		// overlay's upper layer, for tests that run side by side.
		MemoryMiB: 4096,
		Stdout:    stream, Stderr: stream,
	})
	keepArtifacts(t, filepath.Join(work, "artifacts"), filepath.Base(in.pkg))
	if err != nil {
		t.Fatalf("guest run of %s: %v", in.pkg, err)
	}
	t.Logf("guest run of %s: boot %s, whole run %s, exit %d", in.pkg,
		res.BootTime.Round(time.Millisecond), res.Duration.Round(time.Second), res.ExitCode)
	text := out.String()
	summarizeInner(t, text)
	if res.ExitCode != 0 {
		t.Fatalf("the inner tests of %s failed in the guest (exit %d); their output is above", in.pkg, res.ExitCode)
	}
	if !regexp.MustCompile(`(?m)^PASS$`).MatchString(text) {
		t.Fatalf("the inner tests of %s exited 0 but did not print PASS", in.pkg)
	}
	return text
}

// summarizeInner repeats, in this test's log, the figures the inner tests
// printed: sanity counts and skips, bench ratios, soak figures.
func summarizeInner(t *testing.T, text string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "SANITY ") || strings.HasPrefix(line, "ratio ") || strings.HasPrefix(line, "BENCH ") || strings.HasPrefix(line, "SOAK ") {
			t.Log(line)
		}
	}
}

// keepArtifacts copies the inner run's logs and reports out of the test's
// temporary directory, which go test removes.
func keepArtifacts(t *testing.T, dir, name string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	dst := filepath.Join(guestvm.DefaultCacheDir(), "guest-artifacts", name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Logf("keeping artifacts: %v", err)
		return
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || e.IsDir() {
			continue
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			t.Logf("keeping artifacts: %v", err)
			return
		}
	}
	t.Logf("plugin logs and reports of the guest run: %s", dst)
}
