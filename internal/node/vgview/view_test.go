package vgview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
)

const (
	mi = uint64(1) << 20
	gi = uint64(1) << 30
	ex = 4 * mi
)

func qty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func TestThickCapacity(t *testing.T) {
	tests := []struct {
		name  string
		class deviceclass.DeviceClass
		free  uint64
		want  uint64
	}{
		{"no spare", deviceclass.DeviceClass{}, 10 * gi, 10 * gi},
		{"spare", deviceclass.DeviceClass{Spare: qty("1Gi")}, 10 * gi, 9 * gi},
		{"spare larger than free", deviceclass.DeviceClass{Spare: qty("2Gi")}, 1 * gi, 0},
		{"spare equal to free", deviceclass.DeviceClass{Spare: qty("1Gi")}, 1 * gi, 0},
		{"rounded down to extents", deviceclass.DeviceClass{Spare: qty("1Mi")}, 100 * mi, 96 * mi},
		{"raid1 one mirror", deviceclass.DeviceClass{LVCreateOptions: lvm.LVOptions{Mirrors: 1}}, 10 * gi, (10*gi - 2*ex) / 2},
		{"raid1 two mirrors, spare", deviceclass.DeviceClass{Spare: qty("1Gi"), LVCreateOptions: lvm.LVOptions{Mirrors: 2}}, 10*gi + 3*ex, 3 * gi},
		{"stripes do not change the total", deviceclass.DeviceClass{LVCreateOptions: lvm.LVOptions{Stripes: 2}}, 8 * gi, 8 * gi},
		{"empty vg", deviceclass.DeviceClass{}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ThickCapacity(&tt.class, lvm.VolumeGroup{Size: 20 * gi, Free: tt.free, ExtentSize: ex})
			if c.Available != tt.want || c.MaxVolume != tt.want || c.ExtentSize != ex {
				t.Errorf("got %+v, want available = max = %d", c, tt.want)
			}
		})
	}
}

func TestThinCapacity(t *testing.T) {
	tests := []struct {
		name        string
		ratio       float64
		spare       string
		poolSize    uint64
		dataPercent float64
		virtual     uint64
		want        uint64
	}{
		{"empty pool ratio 1", 0, "", 10 * gi, 0, 0, 10 * gi},
		{"empty pool ratio 4", 4, "", 10 * gi, 0, 0, 40 * gi},
		{"virtual bound", 4, "", 10 * gi, 10, 30 * gi, 10 * gi},
		{"real-space bound", 4, "", 10 * gi, 80, 20 * gi, 8 * gi},
		{"spare in the pool", 2, "1Gi", 10 * gi, 0, 0, 18 * gi},
		{"overcommitted beyond the ratio", 1, "", 10 * gi, 0, 12 * gi, 0},
		{"full pool", 4, "", 10 * gi, 100, 1 * gi, 0},
		{"bogus percent clamped", 1, "", 10 * gi, 150, 0, 0},
		{"fractional ratio, rounded to extents", 1.5, "", 10 * gi, 0, 0, 15 * gi},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deviceclass.DeviceClass{ThinPool: "pool", OverprovisionRatio: tt.ratio}
			if tt.spare != "" {
				d.Spare = qty(tt.spare)
			}
			c := ThinCapacity(&d, lvm.VolumeGroup{ExtentSize: ex},
				lvm.ThinPool{Size: tt.poolSize, DataPercent: tt.dataPercent, VirtualSize: tt.virtual})
			if c.Available != tt.want || c.MaxVolume != tt.want {
				t.Errorf("got %+v, want %d", c, tt.want)
			}
			if c.Available%ex != 0 {
				t.Errorf("available %d is not a whole number of extents", c.Available)
			}
		})
	}
}

func TestRoundUp(t *testing.T) {
	for _, tt := range []struct{ in, want uint64 }{{0, 0}, {1, ex}, {ex, ex}, {ex + 1, 2 * ex}} {
		if got := RoundUp(tt.in, ex); got != tt.want {
			t.Errorf("RoundUp(%d) = %d, want %d", tt.in, got, tt.want)
		}
	}
	if RoundUp(5, 0) != 5 {
		t.Error("RoundUp with no extent size changed the size")
	}
}

// fakeReporter answers reports from report as provisiontest's LVM does
// (only the VGs named, a named one missing or unreadable an error), with
// what the view's tests also ask of a report: err fails every one, vgErr
// makes the VGs it names unreadable, block holds a report until it is
// closed, and calls and asked count the reports and record the names.
type fakeReporter struct {
	mu     sync.Mutex
	report lvm.Report
	err    error
	vgErr  map[string]error
	calls  int
	asked  [][]string
	block  chan struct{}
}

func (f *fakeReporter) Report(ctx context.Context, vgs ...string) (*lvm.Report, error) {
	f.mu.Lock()
	f.calls++
	f.asked = append(f.asked, vgs)
	r, err, block, vgErr := f.report, f.err, f.block, f.vgErr
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	state := provisiontest.NewLVM()
	state.SetReport(r)
	state.Unreadable = vgErr
	return state.Report(ctx, vgs...)
}

func (f *fakeReporter) set(r lvm.Report, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.report, f.err = r, err
}

func testConfig() *deviceclass.Config {
	return &deviceclass.Config{DeviceClasses: []deviceclass.DeviceClass{
		{Name: "thick", VolumeGroup: "vg1", Default: true, Spare: qty("1Gi")},
		{Name: "thin", VolumeGroup: "vg1", ThinPool: "pool", OverprovisionRatio: 2},
	}}
}

// fastOnVG2 is testConfig with a third class, fast, on a volume group of
// its own, vg2, and testReport with vg2 in it: 4 GiB, 3 GiB free, on pvs
// physical volumes.
func fastOnVG2(pvs int) (*deviceclass.Config, func() lvm.Report) {
	cfg := testConfig()
	cfg.DeviceClasses = append(cfg.DeviceClasses, deviceclass.DeviceClass{Name: "fast", VolumeGroup: "vg2"})
	return cfg, func() lvm.Report {
		r := testReport()
		r.VolumeGroups = append(r.VolumeGroups, lvm.VolumeGroup{Name: "vg2", Size: 4 * gi, Free: 3 * gi, ExtentSize: ex, PVCount: pvs})
		return r
	}
}

func testReport() lvm.Report {
	return lvm.Report{
		VolumeGroups: []lvm.VolumeGroup{
			{Name: "vg1", Size: 20 * gi, Free: 10 * gi, ExtentSize: ex},
			{Name: "other", Size: 5 * gi, Free: 5 * gi, ExtentSize: ex},
		},
		LogicalVolumes: []lvm.LogicalVolume{
			{Name: "pool", VolumeGroup: "vg1", Size: 8 * gi, Attr: lvm.Attributes{Type: lvm.TypeThinPool}},
			{Name: "b", VolumeGroup: "vg1", Size: 1 * gi, Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thick"}},
			{Name: "a", VolumeGroup: "vg1", Size: 1 * gi, Pool: "pool", Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thin"}},
			{Name: "foreign", VolumeGroup: "vg1", Size: 1 * gi},
			{Name: "elsewhere", VolumeGroup: "other", Size: 1 * gi, Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thick"}},
		},
		ThinPools: []lvm.ThinPool{{Name: "pool", VolumeGroup: "vg1", Size: 8 * gi, VirtualSize: 1 * gi, DataPercent: 25, MetadataPercent: 5, ThinVolumes: 1}},
	}
}

func TestViewRefreshAndQueries(t *testing.T) {
	rep := &fakeReporter{report: testReport()}
	reg := prometheus.NewRegistry()
	rec := metrics.NewRecorder(reg)
	cfg := testConfig()
	v := New(rep, cfg, rec)
	if err := v.Ready(); err == nil {
		t.Fatal("Ready before the first refresh is nil")
	}
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := v.Ready(); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	thick, _ := cfg.Class("thick")
	thin, _ := cfg.Class("thin")
	c, err := v.Capacity(thick)
	if err != nil || c.Available != 9*gi {
		t.Fatalf("thick capacity = %+v, %v; want 9Gi", c, err)
	}
	c, err = v.Capacity(thin)
	// virtual room 16Gi-1Gi = 15Gi; real room (8Gi - 2Gi used) x 2 = 12Gi.
	if err != nil || c.Available != 12*gi {
		t.Fatalf("thin capacity = %+v, %v; want 12Gi", c, err)
	}
	var names []string
	for _, lv := range v.Volumes() {
		names = append(names, lv.VolumeGroup+"/"+lv.Name)
	}
	if strings.Join(names, ",") != "vg1/a,vg1/b" {
		t.Errorf("Volumes = %v; want the carve LVs of configured VGs, sorted", names)
	}
	if _, ok := v.FindLV("elsewhere"); ok {
		t.Error("FindLV found an LV in an unconfigured VG")
	}
	if lv, ok := v.FindLV("b"); !ok || lv.VolumeGroup != "vg1" {
		t.Errorf("FindLV(b) = %+v, %v", lv, ok)
	}
	if _, ok := v.LV("vg1", "foreign"); !ok {
		t.Error("LV(vg1, foreign) not found")
	}
	if rep.calls != 1 {
		t.Errorf("%d reports after one refresh", rep.calls)
	}

	want := `
# HELP carve_capacity_available_bytes Capacity reported to Kubernetes through GetCapacity for a device class (free space minus spare; for thin classes bounded by the overprovision ratio).
# TYPE carve_capacity_available_bytes gauge
carve_capacity_available_bytes{device_class="thick"} 9.663676416e+09
carve_capacity_available_bytes{device_class="thin"} 1.2884901888e+10
# HELP carve_volumes Number of carve volumes (LVs with carve's tags) of a device class; quarantined orphans (carve_quarantined_volumes) are not counted.
# TYPE carve_volumes gauge
carve_volumes{device_class="thick"} 1
carve_volumes{device_class="thin"} 1
# HELP carve_thin_pool_data_percent Used share (0-100) of the data of a thin class's pool.
# TYPE carve_thin_pool_data_percent gauge
carve_thin_pool_data_percent{device_class="thin",thin_pool="pool",volume_group="vg1"} 25
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"carve_capacity_available_bytes", "carve_volumes", "carve_thin_pool_data_percent"); err != nil {
		t.Error(err)
	}
}

func TestViewLocalMutations(t *testing.T) {
	rep := &fakeReporter{report: testReport()}
	cfg := testConfig()
	v := New(rep, cfg, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	thick, _ := cfg.Class("thick")
	thin, _ := cfg.Class("thin")

	v.Created(lvm.LogicalVolume{Name: "c", VolumeGroup: "vg1", Size: 2 * gi, Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thick"}})
	if c, _ := v.Capacity(thick); c.Available != 7*gi {
		t.Errorf("thick capacity after a 2Gi create = %d, want 7Gi", c.Available)
	}
	v.Created(lvm.LogicalVolume{Name: "d", VolumeGroup: "vg1", Size: 5 * gi, Pool: "pool", Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thin"}})
	// virtual room 16-6 = 10Gi, real room 12Gi.
	if c, _ := v.Capacity(thin); c.Available != 10*gi {
		t.Errorf("thin capacity after a 5Gi create = %d, want 10Gi", c.Available)
	}
	// Created twice (a retry) must not count twice.
	v.Created(lvm.LogicalVolume{Name: "c", VolumeGroup: "vg1", Size: 2 * gi, Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thick"}})
	if c, _ := v.Capacity(thick); c.Available != 7*gi {
		t.Errorf("thick capacity after a repeated Created = %d, want 7Gi", c.Available)
	}
	if len(v.Volumes()) != 4 {
		t.Errorf("Volumes = %d, want 4", len(v.Volumes()))
	}
	v.Removed("vg1", "c")
	v.Removed("vg1", "d")
	v.Removed("vg1", "never-there")
	if c, _ := v.Capacity(thick); c.Available != 9*gi {
		t.Errorf("thick capacity after removal = %d, want 9Gi", c.Available)
	}
	if c, _ := v.Capacity(thin); c.Available != 12*gi {
		t.Errorf("thin capacity after removal = %d, want 12Gi", c.Available)
	}
	if rep.calls != 1 {
		t.Errorf("local mutations ran %d reports; want none beyond the first", rep.calls-1)
	}
}

func TestViewMissingVGAndErrors(t *testing.T) {
	rep := &fakeReporter{report: testReport()}
	cfg := testConfig()
	v := New(rep, cfg, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The pool vanishes.
	r := testReport()
	r.ThinPools = nil
	rep.set(r, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	thin, _ := cfg.Class("thin")
	if _, err := v.Capacity(thin); !errors.Is(err, ErrClassUnavailable) {
		t.Errorf("thin capacity without its pool: %v; want ErrClassUnavailable", err)
	}
	if err := v.Ready(); err == nil || !strings.Contains(err.Error(), "thin pool vg1/pool is missing") {
		t.Errorf("Ready = %v", err)
	}
	// The VG vanishes.
	rep.set(lvm.Report{}, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := v.Ready(); err == nil || !strings.Contains(err.Error(), `volume group "vg1" is missing`) {
		t.Errorf("Ready = %v", err)
	}
	// LVM fails for every VG: the error shows in Ready.
	rep.set(testReport(), errors.New("lvm exploded"))
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatalf("Refresh = %v; an unreadable VG is the class's problem, not the refresh's", err)
	}
	if err := v.Ready(); err == nil || !strings.Contains(err.Error(), "lvm exploded") {
		t.Errorf("Ready = %v", err)
	}
	// A refresh whose context ended keeps the view and says so to its
	// caller; Ready is TestRequestRefreshThatEndsKeepsReady's.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep.set(testReport(), context.Canceled)
	if err := v.Refresh(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Refresh with a cancelled context = %v", err)
	}
	// It comes back.
	rep.set(testReport(), nil)
	if err := v.Refresh(context.Background()); err != nil || v.Ready() != nil {
		t.Fatalf("after recovery: %v, %v", err, v.Ready())
	}
}

func TestViewRunRefreshesAfterMutation(t *testing.T) {
	rep := &fakeReporter{report: testReport()}
	v := New(rep, testConfig(), nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.Run(ctx, time.Hour, time.Millisecond)
	v.Removed("vg1", "b")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := v.LV("vg1", "b"); ok {
			break // the refresh brought back what the (unchanged) report holds
		}
		if time.Now().After(deadline) {
			t.Fatal("no refresh after a mutation")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A missing or unreadable volume group, a missing PV, a missing or broken
// thin pool: each makes only the classes that use it unavailable, with the
// reason in Capacity and Ready, while the other classes keep their fresh
// capacity. Only carve's volume groups are read.
func TestViewOneBadClassLeavesTheOthers(t *testing.T) {
	cfg, withVG2 := fastOnVG2(2)
	good := func() lvm.Report {
		r := withVG2()
		r.LogicalVolumes = append(r.LogicalVolumes, lvm.LogicalVolume{Name: "f", VolumeGroup: "vg2", Size: gi, Tags: []string{volume.TagOwner, volume.TagClassPrefix + "fast"}})
		return r
	}
	// Capacities when all is well: thick 9Gi, thin 12Gi, fast 3Gi.
	healthy := map[string]uint64{"thick": 9 * gi, "thin": 12 * gi, "fast": 3 * gi}
	tests := []struct {
		name   string
		change func(r *lvm.Report, rep *fakeReporter)
		bad    map[string]string // class -> what Capacity's and Ready's error say
		// vg2Listed: vg2's volume is still listed (its last known state).
		vg2Listed bool
		// notServing: LVM could read none of the VGs, so the plugin
		// cannot serve at all (Probe).
		notServing bool
	}{
		{name: "volume group missing", change: func(r *lvm.Report, _ *fakeReporter) {
			r.VolumeGroups = slices.DeleteFunc(r.VolumeGroups, func(vg lvm.VolumeGroup) bool { return vg.Name == "vg2" })
			r.LogicalVolumes = slices.DeleteFunc(r.LogicalVolumes, func(lv lvm.LogicalVolume) bool { return lv.VolumeGroup == "vg2" })
		}, bad: map[string]string{"fast": `volume group "vg2" is missing`}},
		{name: "volume group unreadable", change: func(_ *lvm.Report, rep *fakeReporter) {
			rep.vgErr = map[string]error{"vg2": errors.New("checksum error in metadata")}
		}, bad: map[string]string{"fast": `volume group "vg2" could not be read: `}, vg2Listed: true},
		{name: "volume group with a missing PV", change: func(r *lvm.Report, _ *fakeReporter) {
			r.VolumeGroups[2].MissingPVs = 1
		}, bad: map[string]string{"fast": `volume group "vg2" has 1 missing physical volume(s)`}, vg2Listed: true},
		{name: "thin pool missing", change: func(r *lvm.Report, _ *fakeReporter) {
			r.ThinPools = nil
		}, bad: map[string]string{"thin": "thin pool vg1/pool is missing"}, vg2Listed: true},
		{name: "thin pool metadata read-only", change: func(r *lvm.Report, _ *fakeReporter) {
			r.LogicalVolumes[0].Attr.Health = lvm.HealthMetadataReadOnly
		}, bad: map[string]string{"thin": "thin pool vg1/pool is metadata-read-only"}, vg2Listed: true},
		{name: "every volume group unreadable", change: func(_ *lvm.Report, rep *fakeReporter) {
			rep.vgErr = map[string]error{"vg1": errors.New("no lvm"), "vg2": errors.New("no lvm")}
		}, bad: map[string]string{"thick": "could not be read", "thin": "could not be read", "fast": "could not be read"}, vg2Listed: true,
			notServing: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := &fakeReporter{report: good()}
			v := New(rep, cfg, nil)
			if err := v.Refresh(context.Background()); err != nil || v.Ready() != nil {
				t.Fatalf("healthy: %v, %v", err, v.Ready())
			}
			r := good()
			tt.change(&r, rep)
			rep.set(r, nil)
			if err := v.Refresh(context.Background()); err != nil {
				t.Fatalf("Refresh = %v; one bad volume group must not fail the refresh", err)
			}
			ready := v.Ready()
			// Probe follows Serving: csi-provisioner waits on it at
			// start, and the healthy classes must keep provisioning.
			if err := v.Serving(); (err != nil) != tt.notServing {
				t.Errorf("Serving = %v; want an error only when LVM can read none of the volume groups", err)
			} else if err != nil && !strings.Contains(err.Error(), "LVM cannot read any of this node's volume groups") {
				t.Errorf("Serving = %v", err)
			}
			for _, d := range cfg.DeviceClasses {
				c, err := v.Capacity(&d)
				if want, isBad := tt.bad[d.Name]; isBad {
					if !errors.Is(err, ErrClassUnavailable) || !strings.Contains(err.Error(), want) {
						t.Errorf("class %s: Capacity = %+v, %v; want ErrClassUnavailable saying %q", d.Name, c, err, want)
					}
					if ready == nil || !strings.Contains(ready.Error(), "device class "+d.Name+": ") || !strings.Contains(ready.Error(), want) {
						t.Errorf("Ready = %v; want it to say class %s: %q", ready, d.Name, want)
					}
					continue
				}
				if err != nil || c.Available != healthy[d.Name] {
					t.Errorf("class %s: Capacity = %+v, %v; want %d: a healthy class is not affected", d.Name, c, err, healthy[d.Name])
				}
				if ready != nil && strings.Contains(ready.Error(), "device class "+d.Name+": ") {
					t.Errorf("Ready blames healthy class %s: %v", d.Name, ready)
				}
			}
			if _, ok := v.LV("vg2", "f"); ok != tt.vg2Listed {
				t.Errorf("vg2's volume in the view: %t, want %t", ok, tt.vg2Listed)
			}
			for _, asked := range rep.asked {
				if len(asked) == 0 || slices.Contains(asked, "other") {
					t.Errorf("a report asked for %v; only carve's volume groups are read", asked)
				}
			}
		})
	}
}

// A report started before a local change must not undo it when it ends
// after it: neither an LV carve created nor tags carve changed
// (TagUnfinished taken off).
func TestViewStaleRefreshKeepsLocalChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(v *View)
		// lost says what the stale refresh undid, "" when nothing.
		lost func(v *View) string
	}{{
		name: "created LV",
		change: func(v *View) {
			v.Created(lvm.LogicalVolume{Name: "new", VolumeGroup: "vg1", Size: gi, Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thick"}})
		},
		lost: func(v *View) string {
			if _, ok := v.LV("vg1", "new"); !ok {
				return "a stale refresh dropped an LV created while it ran"
			}
			return ""
		},
	}, {
		name: "changed tags",
		change: func(v *View) {
			b, _ := v.LV("vg1", "b")
			b.Tags = append(slices.Clone(b.Tags), "changed")
			v.Created(b)
		},
		lost: func(v *View) string {
			if got, _ := v.LV("vg1", "b"); !slices.Contains(got.Tags, "changed") {
				return fmt.Sprintf("a stale refresh put back the old tags: %v", got.Tags)
			}
			return ""
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &fakeReporter{report: testReport()}
			v := New(rep, testConfig(), nil)
			if err := v.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			rep.block = make(chan struct{})
			done := make(chan error)
			go func() { done <- v.Refresh(context.Background()) }()
			// The change comes once the second report has started.
			for {
				rep.mu.Lock()
				n := rep.calls
				rep.mu.Unlock()
				if n == 2 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			tc.change(v)
			close(rep.block)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if msg := tc.lost(v); msg != "" {
				t.Fatal(msg)
			}
		})
	}
}

func TestUnzeroedThinClassesNamesPoolsWithoutZeroing(t *testing.T) {
	for _, zero := range []bool{true, false} {
		r := testReport()
		r.ThinPools[0].ZeroNewBlocks = zero
		v := New(&fakeReporter{report: r}, testConfig(), nil)
		if err := v.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		var want []string
		if !zero {
			want = []string{"thin"}
		}
		if got := v.UnzeroedThinClasses(); !slices.Equal(got, want) {
			t.Errorf("pool zeroing %v: UnzeroedThinClasses() = %v, want %v", zero, got, want)
		}
	}
}

// TestMetadataAreaFullMeansNoCapacity: a volume group whose metadata area
// cannot take one more LV gives every class on it no capacity, however
// many extents are free; a VG reported without metadata figures is not
// limited; local creates count against the area until the next report.
func TestMetadataAreaFullMeansNoCapacity(t *testing.T) {
	tests := []struct {
		name       string
		size, free uint64
		full       bool
	}{
		{"not reported", 0, 0, false},
		{"room for many", 1044480, 500000, false},
		{"room for exactly one", 1044480, lvm.LVMetadataBytes, false},
		{"no room for one", 1044480, lvm.LVMetadataBytes - 1, true},
		{"none at all", 1044480, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testReport()
			r.VolumeGroups[0].MetadataAreaSize, r.VolumeGroups[0].MetadataAreaFree = tt.size, tt.free
			cfg := testConfig()
			v := New(&fakeReporter{report: r}, cfg, nil)
			if err := v.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			for i := range cfg.DeviceClasses {
				c, err := v.Capacity(&cfg.DeviceClasses[i])
				if err != nil {
					t.Fatal(err)
				}
				if c.MetadataFull != tt.full || (tt.full && (c.Available != 0 || c.MaxVolume != 0)) || (!tt.full && c.Available == 0) {
					t.Errorf("class %s: %+v, want metadata full %v", cfg.DeviceClasses[i].Name, c, tt.full)
				}
			}
		})
	}
	r := testReport()
	r.VolumeGroups[0].MetadataAreaSize, r.VolumeGroups[0].MetadataAreaFree = 1044480, lvm.LVMetadataBytes
	cfg := testConfig()
	v := New(&fakeReporter{report: r}, cfg, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	v.Created(lvm.LogicalVolume{Name: "new", VolumeGroup: "vg1", Size: gi})
	if c, _ := v.Capacity(&cfg.DeviceClasses[0]); !c.MetadataFull {
		t.Errorf("after a local create took the last metadata room: %+v, want metadata full", c)
	}
}

// TestReadyFailsWhenTheViewIsStale: a refresh that never returns (lvm
// hung in the kernel) leaves no error behind; Ready fails all the same
// once no report has come back for the StaleAfter limit, and recovers
// with the next report.
func TestReadyFailsWhenTheViewIsStale(t *testing.T) {
	rep := &fakeReporter{report: testReport()}
	v := New(rep, testConfig(), nil)
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	v.now = func() time.Time { return now }
	v.StaleAfter(5 * time.Minute)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := v.Ready(); err != nil {
		t.Fatalf("fresh view: %v", err)
	}
	now = now.Add(4 * time.Minute)
	if err := v.Ready(); err != nil {
		t.Fatalf("4 min old, limit 5: %v", err)
	}
	now = now.Add(2 * time.Minute)
	if err := v.Ready(); err == nil || !strings.Contains(err.Error(), "6m0s old") {
		t.Fatalf("6 min old, limit 5: Ready = %v, want stale", err)
	}
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := v.Ready(); err != nil {
		t.Fatalf("after a report came back: %v", err)
	}
}

// A request's refresh that ends with the request (its deadline passed, its
// client went away) says nothing about LVM: Ready and Serving stay as the
// last real refresh left them (earlier review's finding 17). Run's own
// timeout, with Run still running, is LVM not answering and does count.
func TestRequestRefreshThatEndsKeepsReady(t *testing.T) {
	expired := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	cancelled := func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	for _, tt := range []struct {
		name string
		ctx  func() context.Context
		err  error
	}{
		{"deadline exceeded", expired, context.DeadlineExceeded},
		{"cancelled", cancelled, context.Canceled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep := &fakeReporter{report: testReport()}
			v := New(rep, testConfig(), nil)
			if err := v.Refresh(context.Background()); err != nil || v.Ready() != nil {
				t.Fatalf("first refresh: %v, Ready %v", err, v.Ready())
			}
			rep.set(testReport(), tt.err)
			if err := v.Refresh(tt.ctx()); !errors.Is(err, tt.err) {
				t.Fatalf("Refresh = %v, want %v", err, tt.err)
			}
			if err := v.Ready(); err != nil {
				t.Errorf("Ready after the request's refresh ended = %v, want nil", err)
			}
			if err := v.Serving(); err != nil {
				t.Errorf("Serving after the request's refresh ended = %v, want nil", err)
			}
		})
	}
	t.Run("Run's own timeout", func(t *testing.T) {
		rep := &fakeReporter{report: testReport()}
		v := New(rep, testConfig(), nil)
		if err := v.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		v.runTimeout = time.Millisecond
		block := make(chan struct{})
		defer close(block)
		rep.mu.Lock()
		rep.block = block
		rep.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go v.Run(ctx, 5*time.Millisecond, time.Millisecond)
		deadline := time.Now().Add(10 * time.Second)
		for v.Ready() == nil {
			if time.Now().After(deadline) {
				t.Fatal("Ready still nil after Run's refreshes timed out")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := v.Ready(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Ready = %v, want the timeout", err)
		}
	})
}

// TestVolumesGaugeLeavesOutQuarantinedOrphans: an orphan the audit
// quarantined counts in carve_quarantined_volumes (the controller's), not
// in carve_volumes.
func TestVolumesGaugeLeavesOutQuarantinedOrphans(t *testing.T) {
	r := testReport()
	orig := volume.LVNameFor("gone")
	qname, _ := volume.QuarantineName(orig)
	r.LogicalVolumes = append(r.LogicalVolumes, lvm.LogicalVolume{Name: qname, VolumeGroup: "vg1", Size: 1 * gi,
		Tags: append(volume.VolumeTags("gone", "thick", nil), volume.OrphanTags(orig, time.Unix(1e9, 0))...)})
	reg := prometheus.NewRegistry()
	v := New(&fakeReporter{report: r}, testConfig(), metrics.NewRecorder(reg))
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP carve_volumes Number of carve volumes (LVs with carve's tags) of a device class; quarantined orphans (carve_quarantined_volumes) are not counted.
# TYPE carve_volumes gauge
carve_volumes{device_class="thick"} 1
carve_volumes{device_class="thin"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "carve_volumes"); err != nil {
		t.Error(err)
	}
}
