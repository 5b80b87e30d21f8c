//go:build guestinner

package nodeinner

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/test/plugintest"
)

// The benchmarks time the plugin through its gRPC socket against the raw
// commands it wraps, on the same VG in the same run, alternating the two so
// that drift (page cache, the guest's clock under TCG) hits both alike.
// They print ratios; they assert only that every operation worked.

// TestBenchCreateDelete: CreateVolume + DeleteVolume against raw lvcreate +
// lvremove with the options carve passes (lvm/args.go). Goal: ratio <= 1.15.
func TestBenchCreateDelete(t *testing.T) {
	const rounds = 10
	e := newEnv(t, "benchcd")
	capability := plugintest.MountCapability("ext4")
	size := 64 * mib
	var carve, raw []time.Duration
	for i := 0; i <= rounds; i++ {
		ctx, cancel := e.ctx()
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
		c := time.Since(start)

		lv := fmt.Sprintf("raw-%d", i)
		start = time.Now()
		if _, err := e.vg.LVM(ctx, "lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y",
			"--name", lv, "--size", strconv.FormatInt(size, 10)+"b",
			"--addtag", "carve.dev/owner=carve", "--addtag", "carve.dev/class="+class, e.vg.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := e.vg.LVM(ctx, "lvremove", "--yes", e.vg.Name+"/"+lv); err != nil {
			t.Fatal(err)
		}
		r := time.Since(start)
		cancel()
		if i == 0 {
			continue // warm-up: first exec of each binary, LVM's first scan
		}
		carve, raw = append(carve, c), append(raw, r)
	}
	report(t, "create+delete 64MiB", "carve CreateVolume+DeleteVolume", carve, "lvm lvcreate+lvremove", raw, 1.15)
}

// TestBenchGetCapacity: GetCapacity (served from memory) against one raw
// `vgs` (what answering from LVM would cost). Goal: 100x faster.
func TestBenchGetCapacity(t *testing.T) {
	const calls, vgsCalls = 200, 5
	e := newEnv(t, "benchcap")
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
	fmt.Printf("ratio carve GetCapacity vs one raw vgs: %.0fx faster (goal >= 100x: %s; carve median %s, p90 %s over %d calls; vgs median %s over %d)\n",
		speedup, verdict(speedup >= 100), c, percentile(carve, 90), calls, m, vgsCalls)
}

// TestBenchNodeStage: NodeStageVolume of a blank 1 GiB volume against raw
// mkfs.ext4 + mount with the options carve (mount-utils) uses: mkfs.ext4 -F
// -m0, mount -t ext4 -o defaults.
func TestBenchNodeStage(t *testing.T) {
	const rounds = 3
	size := 1024 * mib
	e := newEnv(t, "benchstage")
	capability := plugintest.MountCapability("ext4")
	var carve, raw []time.Duration
	for i := 0; i < rounds; i++ {
		name := fmt.Sprintf("stage-%d", i)
		id := e.create(name, size, capability)
		p := e.paths(name)
		ctx, cancel := e.ctx()
		start := time.Now()
		if _, err := e.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: id, StagingTargetPath: p.staging, VolumeCapability: capability,
		}); err != nil {
			t.Fatalf("NodeStageVolume: %v", err)
		}
		carve = append(carve, time.Since(start))
		if _, err := e.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p.staging}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
		if _, err := e.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}

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
		start = time.Now()
		if _, err := plugintest.Run(ctx, "mkfs.ext4", "-F", "-m0", dev); err != nil {
			t.Fatal(err)
		}
		if _, err := plugintest.Run(ctx, "mount", "-t", "ext4", "-o", "defaults", dev, dir); err != nil {
			t.Fatal(err)
		}
		raw = append(raw, time.Since(start))
		if _, err := plugintest.Run(ctx, "umount", dir); err != nil {
			t.Fatal(err)
		}
		if _, err := e.vg.LVM(ctx, "lvremove", "--yes", e.vg.Name+"/"+lv); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	report(t, "stage 1GiB ext4", "carve NodeStageVolume", carve, "mkfs.ext4 -F -m0 + mount", raw, 0)
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
