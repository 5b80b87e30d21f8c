//go:build guestinner

package nodeinner

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The benchmarks time the plugin through its gRPC socket against the raw
// commands it wraps, on the same VG in the same run, alternating the two so
// that drift (page cache, the guest's clock under TCG) hits both alike.
// They print ratios; they assert only that every operation worked.

// benchRounds is make bench's BENCH_ROUNDS: the rounds of the create+delete
// and stage benchmarks, to settle a ratio near its goal; 0 keeps each
// one's own count.
var benchRounds = flag.Int("bench-rounds", 0, "rounds of TestBenchCreateDelete and TestBenchNodeStage (0: their defaults)")

// roundsOr is benchRounds when it is set, else def.
func roundsOr(def int) int {
	if *benchRounds > 0 {
		return *benchRounds
	}
	return def
}

// TestBenchCreateDelete: CreateVolume + DeleteVolume against raw lvcreate +
// lvremove with the options carve passes (internal/node/lvm/args.go). Goal: ratio <= 1.05.
func TestBenchCreateDelete(t *testing.T) {
	rounds := roundsOr(10)
	e := newEnv(t, "benchcd", 2048*mib)
	capability := plugintest.MountCapability("ext4")
	size := 64 * mib
	viaCarve := func(ctx context.Context, i int) time.Duration {
		start := time.Now()
		rsp, err := e.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: fmt.Sprintf("bench-%d", i), CapacityRange: &csi.CapacityRange{RequiredBytes: size},
			VolumeCapabilities: []*csi.VolumeCapability{capability},
		})
		if err != nil {
			t.Fatalf("CreateVolume: %v", err)
		}
		if _, err := e.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: rsp.GetVolume().GetVolumeId()}); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
		return time.Since(start)
	}
	// carve also marks the LV unfinished in its state directory until it
	// is ready (internal/node/marks): a file and two directory syncs, which its
	// side of the ratio includes.
	viaLVM := func(ctx context.Context, i int) time.Duration {
		lv := fmt.Sprintf("raw-%d", i)
		start := time.Now()
		if _, err := e.vg.LVM(ctx, "lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y",
			"--name", lv, "--size", strconv.FormatInt(size, 10)+"b",
			"--addtag", "carve.dev/owner=carve", "--addtag", "carve.dev/class="+class, e.vg.Name); err != nil {
			t.Fatal(err)
		}
		e.removeRaw(t, ctx, lv)
		return time.Since(start)
	}
	carve, raw, before, after := interleaveScraped(e, rounds, viaCarve, viaLVM)
	report(t, "create+delete 64MiB", "carve CreateVolume+DeleteVolume", carve, "lvm lvcreate+lvremove", raw, 1.05)
	e.printLVMCommands("create+delete", before, after, rounds+1)
	printPhaseMeans("create+delete", before, after, "create", "delete")
}

// interleaveScraped is interleave between two scrapes of carve's metrics.
func interleaveScraped(e *env, rounds int, a, b func(ctx context.Context, i int) time.Duration) (as, bs []time.Duration, before, after plugintest.Metrics) {
	before = e.scrape()
	as, bs = interleave(e, rounds, a, b)
	return as, bs, before, e.scrape()
}

// removeRaw removes the raw side's LV lv, untimed.
func (e *env) removeRaw(t *testing.T, ctx context.Context, lv string) {
	t.Helper()
	if _, err := e.vg.LVM(ctx, "lvremove", "--yes", e.vg.Name+"/"+lv); err != nil {
		t.Fatal(err)
	}
}

// interleave runs a warm-up round of each, then rounds of both, alternating
// which goes first, and returns the timings. Before each it waits until
// carve's view is quiet (see quiet), so that the refresh a mutation (carve's
// or the raw side's) sets off 2 s later lands on neither side's clock.
func interleave(e *env, rounds int, a, b func(ctx context.Context, i int) time.Duration) (as, bs []time.Duration) {
	for i := 0; i <= rounds; i++ {
		run := func(f func(ctx context.Context, i int) time.Duration) time.Duration {
			e.quiet()
			ctx, cancel := e.ctx()
			defer cancel()
			return f(ctx, i)
		}
		var da, db time.Duration
		if i%2 == 0 {
			da, db = run(a), run(b)
		} else {
			db, da = run(b), run(a)
		}
		if i == 0 {
			continue // warm-up: first exec of each binary, LVM's first scan
		}
		as, bs = append(as, da), append(bs, db)
	}
	return as, bs
}

// TestBenchGetCapacity: GetCapacity (served from memory) against one raw
// `vgs` (what answering from LVM would cost), goal 100x faster; then p50
// and p99 under 100 concurrent callers against as many empty calls.
func TestBenchGetCapacity(t *testing.T) {
	const calls, vgsCalls = 200, 5
	e := newEnv(t, "benchcap", 2048*mib)
	ctx, cancel := e.ctx()
	defer cancel()
	req := &csi.GetCapacityRequest{
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
		Parameters:         map[string]string{"carve.dev/device-class": class},
		AccessibleTopology: &csi.Topology{Segments: map[string]string{"topology.carve.dev/node": nodeName}},
	}
	if _, err := e.controller().GetCapacity(ctx, req); err != nil { // warm-up
		t.Fatal(err)
	}
	var carve []time.Duration
	for i := 0; i < calls; i++ {
		start := time.Now()
		rsp, err := e.controller().GetCapacity(ctx, req)
		carve = append(carve, time.Since(start))
		if err != nil || rsp.GetAvailableCapacity() <= 0 {
			t.Fatalf("GetCapacity: %v, available %d", err, rsp.GetAvailableCapacity())
		}
	}
	// Probe does nothing: it is the floor of one gRPC round trip here
	// (under TCG, Go code runs about 28 times slower than on a host).
	var probe []time.Duration
	for i := 0; i < calls; i++ {
		start := time.Now()
		if _, err := csi.NewIdentityClient(e.plugin.Conn).Probe(ctx, &csi.ProbeRequest{}); err != nil {
			t.Fatal(err)
		}
		probe = append(probe, time.Since(start))
	}
	var raw []time.Duration
	for i := 0; i < vgsCalls; i++ {
		start := time.Now()
		if _, err := plugintest.ReadVG(ctx, e.vg); err != nil {
			t.Fatal(err)
		}
		raw = append(raw, time.Since(start))
	}
	m := median(raw)
	c := median(carve)
	speedup := float64(m) / float64(c)
	fmt.Printf("ratio carve GetCapacity vs one raw vgs: %.0fx faster (goal >= 100x: %s; carve median %s, p90 %s over %d calls; "+
		"vgs median %s over %d; an empty gRPC call (Probe) median %s)\n",
		speedup, verdict(speedup >= 100), c, percentile(carve, 90), calls, m, vgsCalls, median(probe))

	// 100 callers at once (csi-provisioner's capacity polls of many
	// classes and topologies, or several clients), against the same
	// number of empty calls (Probe) at once: the floor gRPC and the
	// guest's two CPUs set.
	const callers, each = 100, 10
	capCalls := concurrently(t, callers, each, func() error {
		rsp, err := e.controller().GetCapacity(ctx, req)
		if err == nil && rsp.GetAvailableCapacity() <= 0 {
			err = fmt.Errorf("available %d", rsp.GetAvailableCapacity())
		}
		return err
	})
	probeCalls := concurrently(t, callers, each, func() error {
		_, err := csi.NewIdentityClient(e.plugin.Conn).Probe(ctx, &csi.ProbeRequest{})
		return err
	})
	c50, c99 := percentile(capCalls, 50), percentile(capCalls, 99)
	p50, p99 := percentile(probeCalls, 50), percentile(probeCalls, 99)
	fmt.Printf("ratio carve/empty call GetCapacity under %d concurrent callers: p50 %.2f, p99 %.2f "+
		"(GetCapacity p50 %s, p99 %s; Probe p50 %s, p99 %s; %d calls each; one raw vgs median %s, %.0fx carve's p99)\n",
		callers, float64(c50)/float64(p50), float64(c99)/float64(p99), c50, c99, p50, p99, callers*each, m, float64(m)/float64(c99))
}

// concurrently makes callers goroutines call f each times, all released
// at once, and returns every call's time.
func concurrently(t *testing.T, callers, each int, f func() error) []time.Duration {
	t.Helper()
	var (
		mu    sync.Mutex
		times []time.Duration
		first error
		wg    sync.WaitGroup
	)
	release := make(chan struct{})
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			for range each {
				start := time.Now()
				err := f()
				d := time.Since(start)
				mu.Lock()
				times = append(times, d)
				if err != nil && first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	close(release)
	wg.Wait()
	if first != nil {
		t.Fatalf("a concurrent call failed: %v", first)
	}
	return times
}

// TestBenchNodeStage: NodeStageVolume of a blank 1 GiB volume against raw
// mkfs.ext4 + mount with the options carve uses: its default class's
// mkfsOptions then mount-utils' -F -m0, mount -t ext4 -o defaults. The raw
// LVs are made outside carve (its view follows through the backup watch).
func TestBenchNodeStage(t *testing.T) {
	rounds := roundsOr(6)
	size := 1024 * mib
	e := newEnv(t, "benchstage", 3*size)
	capability := plugintest.MountCapability("ext4")
	viaCarve := func(ctx context.Context, i int) time.Duration {
		name := fmt.Sprintf("stage-%d", i)
		id := e.create(name, size, capability)
		p := e.paths(name)
		e.quiet()
		start := time.Now()
		if _, err := e.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: id, StagingTargetPath: p.staging, VolumeCapability: capability, VolumeContext: e.volumeContext[id],
		}); err != nil {
			t.Fatalf("NodeStageVolume: %v", err)
		}
		d := time.Since(start)
		if _, err := e.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p.staging}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
		if _, err := e.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
		return d
	}
	var probes []time.Duration
	// The options carve's default class passes to mkfs.ext4 before
	// mount-utils' own -F -m0.
	mkfsExt4 := fs.DefaultMkfsOptions("ext4")
	viaTools := func(ctx context.Context, i int) time.Duration {
		lv := fmt.Sprintf("rawstage-%d", i)
		if _, err := e.vg.LVM(ctx, "lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y",
			"--name", lv, "--size", strconv.FormatInt(size, 10)+"b", e.vg.Name); err != nil {
			t.Fatal(err)
		}
		dev := "/dev/" + e.vg.Name + "/" + lv
		dir := filepath.Join(e.dir, "raw-"+lv)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		e.quiet()
		// The signature check carve makes first (mount-utils' blkid), timed
		// apart: the raw pair has none, and it is what makes formatting safe.
		start := time.Now()
		// blkid exits 2 when it finds no signature.
		var exit *exec.ExitError
		if _, err := plugintest.Run(ctx, "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", dev); !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Fatalf("blkid of the new LV %s: %v, want exit status 2 (no signature)", dev, err)
		}
		probes = append(probes, time.Since(start))
		start = time.Now()
		if _, err := plugintest.Run(ctx, append(append([]string{"mkfs.ext4"}, mkfsExt4...), "-F", "-m0", dev)...); err != nil {
			t.Fatal(err)
		}
		if _, err := plugintest.Run(ctx, "mount", "-t", "ext4", "-o", "defaults", dev, dir); err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		if _, err := plugintest.Run(ctx, "umount", dir); err != nil {
			t.Fatal(err)
		}
		e.removeRaw(t, ctx, lv)
		return d
	}
	carve, raw, before, after := interleaveScraped(e, rounds, viaCarve, viaTools)
	report(t, "stage 1GiB ext4", "carve NodeStageVolume", carve, "mkfs.ext4 "+strings.Join(mkfsExt4, " ")+" -F -m0 + mount", raw, 1.10)
	probes = probes[1:] // the warm-up round's
	safe := make([]time.Duration, len(raw))
	for i := range raw {
		safe[i] = probes[i] + raw[i]
	}
	fmt.Printf("BENCH stage 1GiB ext4 against the same safe sequence by hand (blkid -p, then mkfs.ext4 + mount): carve/raw %.2f "+
		"(blkid median %s, blkid+mkfs+mount median %s over %d rounds)\n",
		float64(median(carve))/float64(median(safe)), median(probes), median(safe), len(safe))
	// Where a stage's time goes, from carve's own step histograms.
	var parts []string
	for _, step := range []string{"signature_check", "mkfs", "mount"} {
		l := map[string]string{"phase": "stage", "step": step}
		n := after.HistogramCount("carve_step_duration_seconds", l) - before.HistogramCount("carve_step_duration_seconds", l)
		sum := after.HistogramSum("carve_step_duration_seconds", l) - before.HistogramSum("carve_step_duration_seconds", l)
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", step, time.Duration(sum/float64(n)*float64(time.Second)).Round(time.Millisecond)))
		}
	}
	fmt.Printf("BENCH stage steps (mean per stage): %s\n", strings.Join(parts, ", "))
	e.printLVMCommands("create+stage+unstage+delete", before, after, rounds+1)
}

// quietFor is longer than carve's settle after a mutation (2 s) plus one
// refresh under TCG.
const quietFor = 3 * time.Second

// quiet waits until carve has run no lvm command for quietFor: the
// background refresh after the last mutation is over and no other is due.
func (e *env) quiet() {
	e.t.Helper()
	const name = "carve_lvm_command_duration_seconds"
	count := e.scrape().HistogramCount(name, nil)
	since := time.Now()
	for deadline := time.Now().Add(time.Minute); time.Since(since) < quietFor; {
		if time.Now().After(deadline) {
			e.t.Fatalf("carve kept running lvm commands for a minute (%d so far)", count)
		}
		time.Sleep(250 * time.Millisecond)
		if n := e.scrape().HistogramCount(name, nil); n != count {
			count, since = n, time.Now()
		}
	}
}

// scrape is what the plugin's metrics endpoint serves now.
func (e *env) scrape() plugintest.Metrics {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	ms, err := e.plugin.Scrape(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return ms
}

// printLVMCommands prints the lvm commands the plugin ran between two
// scrapes, per operation (periodic refreshes included).
func (e *env) printLVMCommands(what string, before, after plugintest.Metrics, ops int) {
	const name = "carve_lvm_command_duration_seconds"
	var parts []string
	for _, c := range after.LabelValues(name, "command", nil) {
		l := map[string]string{"command": c}
		n := after.HistogramCount(name, l) - before.HistogramCount(name, l)
		sum := after.HistogramSum(name, l) - before.HistogramSum(name, l)
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f (mean %s)", c, float64(n)/float64(ops),
				time.Duration(sum/float64(n)*float64(time.Second)).Round(time.Millisecond)))
		}
	}
	sort.Strings(parts)
	fmt.Printf("BENCH lvm commands carve ran per %s: %s\n", what, strings.Join(parts, ", "))
}

// printPhaseMeans prints the mean time carve's handlers took per phase
// (carve_phase_duration_seconds) between two scrapes, warm-up included:
// what a client waits beyond it is gRPC and the client itself.
func printPhaseMeans(what string, before, after plugintest.Metrics, phases ...string) {
	const name = "carve_phase_duration_seconds"
	var parts []string
	for _, ph := range phases {
		l := map[string]string{"phase": ph}
		n := after.HistogramCount(name, l) - before.HistogramCount(name, l)
		if n == 0 {
			continue
		}
		sum := after.HistogramSum(name, l) - before.HistogramSum(name, l)
		parts = append(parts, fmt.Sprintf("%s %s over %d", ph, time.Duration(sum/float64(n)*float64(time.Second)).Round(100*time.Microsecond), n))
	}
	fmt.Printf("BENCH carve's handler time per %s (mean, warm-up included): %s\n", what, strings.Join(parts, ", "))
}

// report prints medians and the carve/raw ratio; goal 0 means none.
func report(t *testing.T, what, carveName string, carve []time.Duration, rawName string, raw []time.Duration, goal float64) {
	t.Helper()
	c, r := median(carve), median(raw)
	ratio := float64(c) / float64(r)
	goalText := ""
	if goal > 0 {
		goalText = fmt.Sprintf("goal <= %.2f: %s; ", goal, verdict(ratio <= goal))
	}
	fmt.Printf("ratio carve/raw %s: %.2f (%s%s median %s, %s median %s over %d rounds)\n",
		what, ratio, goalText, carveName, c, rawName, r, len(carve))
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "NOT met"
}

func median(ds []time.Duration) time.Duration { return percentile(ds, 50) }

func percentile(ds []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

// TestBenchSnapshotCreate: CreateSnapshot of a thin volume against raw
// `lvcreate --snapshot` with the options and tags carve passes. Goal:
// ratio <= 1.10. Deletions are not timed.
func TestBenchSnapshotCreate(t *testing.T) {
	const rounds = 10
	e := newSnapEnv(t, "benchsnap")
	id := e.createInClass("bench-origin", 64*mib, blockCapability(), "thin")
	origin := lvName(t, id)
	var snapIDs []string
	viaCarve := func(ctx context.Context, i int) time.Duration {
		start := time.Now()
		rsp, err := e.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: fmt.Sprintf("bench-snap-%d", i), SourceVolumeId: id})
		d := time.Since(start)
		if err != nil {
			t.Fatalf("CreateSnapshot: %v", err)
		}
		snapIDs = append(snapIDs, rsp.GetSnapshot().GetSnapshotId())
		return d
	}
	viaLVM := func(ctx context.Context, i int) time.Duration {
		lv := fmt.Sprintf("raw-snap-%d", i)
		start := time.Now()
		if _, err := e.vg.LVM(ctx, "lvcreate", "--yes", "--snapshot", "--setactivationskip", "y", "--name", lv,
			"--addtag", "carve.dev/owner=carve", "--addtag", "carve.dev/snapshot=raw", "--addtag", "carve.dev/class=thin",
			"--addtag", "carve.dev/origin="+origin, e.vg.Name+"/"+origin); err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		e.removeRaw(t, ctx, lv)
		return d
	}
	carve, raw, before, after := interleaveScraped(e, rounds, viaCarve, viaLVM)
	report(t, "thin snapshot create", "carve CreateSnapshot", carve, "lvm lvcreate --snapshot", raw, 1.10)
	e.printLVMCommands("snapshot", before, after, rounds+1)
	ctx, cancel := e.ctx()
	defer cancel()
	for _, s := range snapIDs {
		if _, err := e.controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s}); err != nil {
			t.Errorf("DeleteSnapshot %s: %v", s, err)
		}
	}
}

// TestBenchRestoreCopy: a restore of a thick snapshot into a thick volume
// (lvcreate, the copy, the tag removal) against the same work done raw:
// lvcreate, `dd bs=4M iflag=direct oflag=direct conv=fsync` of the same
// size, lvchange --deltag. Goal: ratio <= 1.10. Deletions are not timed.
func TestBenchRestoreCopy(t *testing.T) {
	const rounds = 4
	const size = 256 * mib
	e := newSnapEnv(t, "benchcopy")
	id, dev := e.blockVolume("bench-copy-origin", size, "thick")
	writeDevice(t, dev, random(size))
	snap := e.snapshot("bench-copy-snap", id)
	snapDev := "/dev/" + snap.GetSnapshotId()[strings.Index(snap.GetSnapshotId(), "/")+1:]
	viaCarve := func(ctx context.Context, i int) time.Duration {
		start := time.Now()
		rsp, err := e.controller().CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: fmt.Sprintf("bench-restore-%d", i), CapacityRange: &csi.CapacityRange{RequiredBytes: size},
			VolumeCapabilities:  []*csi.VolumeCapability{blockCapability()},
			VolumeContentSource: snapshotSource(snap.GetSnapshotId()),
		})
		d := time.Since(start)
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		if _, err := e.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: rsp.GetVolume().GetVolumeId()}); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
		return d
	}
	viaRaw := func(ctx context.Context, i int) time.Duration {
		lv := fmt.Sprintf("raw-restore-%d", i)
		start := time.Now()
		if _, err := e.vg.LVM(ctx, "lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y",
			"--name", lv, "--size", strconv.FormatInt(size, 10)+"b",
			"--addtag", "carve.dev/owner=carve", "--addtag", "carve.dev/copy=pending", e.vg.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := plugintest.Run(ctx, "dd", "if="+snapDev, "of=/dev/"+e.vg.Name+"/"+lv, "bs=4M",
			"count="+strconv.FormatInt(size/(4*mib), 10), "iflag=direct", "oflag=direct", "conv=fsync", "status=none"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.vg.LVM(ctx, "lvchange", "--deltag", "carve.dev/copy=pending", e.vg.Name+"/"+lv); err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		e.removeRaw(t, ctx, lv)
		return d
	}
	carve, raw, before, after := interleaveScraped(e, rounds, viaCarve, viaRaw)
	report(t, fmt.Sprintf("thick restore %dMiB", size/mib), "carve CreateVolume from snapshot", carve, "lvcreate+dd+lvchange", raw, 1.10)
	l := map[string]string{"phase": "restore", "step": "copy"}
	n := after.HistogramCount("carve_step_duration_seconds", l) - before.HistogramCount("carve_step_duration_seconds", l)
	sum := after.HistogramSum("carve_step_duration_seconds", l) - before.HistogramSum("carve_step_duration_seconds", l)
	if n > 0 {
		fmt.Printf("BENCH restore copy step: mean %s for %d MiB (%.0f MiB/s)\n",
			time.Duration(sum/float64(n)*float64(time.Second)).Round(time.Millisecond), size/mib, float64(size/mib)/(sum/float64(n)))
	}
	e.printLVMCommands("restore", before, after, rounds+1)
}
