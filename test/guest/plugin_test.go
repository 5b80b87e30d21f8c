//go:build guesttest

package guest

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The plugin tests run the real `carve node` binary inside the guest on
// loop-device volume groups with real device-mapper, mkfs and mount. Each
// host test boots the guest once and runs one inner test package there
// (test/guest/inner/...): the Go code is built here, where it runs about 28
// times faster than under TCG.

// TestPluginSanity runs csi-sanity against the plugin, for a thick and a
// thin default device class, and checks the plugin's metrics afterwards.
func TestPluginSanity(t *testing.T) {
	out := runInGuest(t, guestRun{
		pkg:       "./inner/sanityinner",
		args:      []string{"-test.run", "^TestSanity$"},
		timeout:   40 * time.Minute,
		withCarve: true,
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
// calls, the plugin alone or its whole process group, TestSoakKillPlugin:
// CARVE_SOAK_OPS sets the length, and CARVE_SOAK_SEED replays a schedule;
// make soak runs it alone and long). CARVE_NODE_RUN runs only the inner
// tests its -test.run pattern picks (then the soak's figures are required
// only when it picks the soak).
func TestPluginNode(t *testing.T) {
	run := "."
	if v := os.Getenv("CARVE_NODE_RUN"); v != "" {
		run = v
	}
	args := []string{"-test.run", run, "-test.skip", "^TestBench"}
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
	out := runInGuest(t, guestRun{
		pkg:       "./inner/nodeinner",
		args:      args,
		timeout:   timeout,
		withCarve: true,
	})
	// The soak's figures are required whenever the pattern picks it
	// (make test's ".", make soak's ^TestSoakKillPlugin$).
	if (run == "." || strings.Contains(run, "TestSoakKillPlugin")) && !regexp.MustCompile(`(?m)^SOAK .* leaks found 0,`).MatchString(out) {
		t.Error("the soak printed no figures with leaks found 0")
	}
}

// TestBenchPlugin measures the plugin against the raw commands it wraps
// (make bench). It asserts only that every operation worked; the figures
// are ratios printed for the reader, never timed assertions.
//
// CARVE_BENCH_RUN (make bench BENCH_RUN=...) picks some of the inner
// benchmarks by -test.run pattern, e.g. ^TestBenchNodeStage$;
// CARVE_BENCH_ROUNDS (BENCH_ROUNDS) sets the rounds of the create+delete
// and stage benchmarks; CARVE_BENCH_DELTA_GIB (BENCH_DELTA_GIB) the size of
// TestBenchSnapshotDelta's thin volume.
func TestBenchPlugin(t *testing.T) {
	run := "^TestBench"
	if v := os.Getenv("CARVE_BENCH_RUN"); v != "" {
		run = v
	}
	args := []string{"-test.run", run}
	if v := os.Getenv("CARVE_BENCH_ROUNDS"); v != "" {
		args = append(args, "-bench-rounds", v)
	}
	if v := os.Getenv("CARVE_BENCH_DELTA_GIB"); v != "" {
		args = append(args, "-bench-delta-gib", v)
	}
	out := runInGuest(t, guestRun{
		pkg:       "./inner/nodeinner",
		args:      args,
		timeout:   30 * time.Minute,
		withCarve: true,
	})
	if n := strings.Count(out, "\nratio carve"); run == "^TestBench" && n != 7 || n == 0 {
		t.Errorf("the guest printed %d of the 7 carve ratio lines", n)
	}
}
