//go:build hosttest

package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
)

const mib = 1 << 20

func TestMain(m *testing.M) {
	// Every test fails on its own when it cannot run; saying it once up
	// front makes the reason the first line of the log.
	if err := lvmtest.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "host tier:", err)
	}
	os.Exit(m.Run())
}

// observer counts the lvm commands a Client ran, by subcommand.
type observer struct {
	mu       sync.Mutex
	commands []string
}

func (o *observer) ObserveCommand(command string, _ time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.commands = append(o.commands, command)
}

func (o *observer) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.commands
	o.commands = nil
	return c
}

// volumeGroup is c's view of the volume group name; a failure fails t.
func volumeGroup(t *testing.T, ctx context.Context, c *lvm.Client, name string) *lvm.VolumeGroup {
	t.Helper()
	vg, err := c.VolumeGroup(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return vg
}

// setup makes a loop VG for the test and a Client pointed at it.
func setup(t *testing.T, opts lvmtest.Options) (*lvmtest.LoopVG, *lvm.Client, *observer) {
	t.Helper()
	v := lvmtest.New(t, opts)
	obs := &observer{}
	return v, lvm.New(lvm.Options{Env: v.Env(), Observer: obs, Timeout: time.Minute}), obs
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestThickLifecycle(t *testing.T) {
	v, c, obs := setup(t, lvmtest.Options{Size: 256 * mib})
	ctx := ctxFor(t)
	before := volumeGroup(t, ctx, c, v.Name)

	created, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "carve-life", Size: 10 * mib,
		Tags: []string{"carve.dev/owner=carve", "carve.dev/volume=6c696665"}})
	if err != nil {
		t.Fatal(err)
	}
	if created.Size != 12*mib {
		t.Errorf("created %d bytes, want 12 MiB (10 MiB rounded up to 4 MiB extents)", created.Size)
	}
	after := volumeGroup(t, ctx, c, v.Name)
	if before.Free-after.Free != 12*mib {
		t.Errorf("free space went from %d to %d, want 12 MiB less", before.Free, after.Free)
	}

	obs.take()
	same, err := c.ExtendLV(ctx, v.Name, "carve-life", 8*mib)
	if err != nil || same.Size != 12*mib {
		t.Fatalf("ExtendLV to a smaller size = %+v, %v; want unchanged 12 MiB", same, err)
	}
	if got := obs.take(); slices.Contains(got, "lvextend") {
		t.Errorf("a no-op extend ran %v", got)
	}
	grown, err := c.ExtendLV(ctx, v.Name, "carve-life", 20*mib+1)
	if err != nil {
		t.Fatal(err)
	}
	read, err := c.GetLV(ctx, v.Name, "carve-life")
	if err != nil {
		t.Fatal(err)
	}
	if grown.Size != 24*mib || read.Size != 24*mib {
		t.Errorf("extended to %d, LVM says %d; want 24 MiB", grown.Size, read.Size)
	}

	if err := c.RemoveLV(ctx, v.Name, "carve-life"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetLV(ctx, v.Name, "carve-life"); !errors.Is(err, lvm.ErrNotFound) {
		t.Errorf("GetLV after remove = %v, want ErrNotFound", err)
	}
	end := volumeGroup(t, ctx, c, v.Name)
	if end.Free != before.Free {
		t.Errorf("free space %d after remove, want %d as before", end.Free, before.Free)
	}
}

// TestCreateResultMatchesLVM: CreateLV builds its result without reading the
// LV back; here LVM's own view must agree with it field by field.
func TestCreateResultMatchesLVM(t *testing.T) {
	v, c, obs := setup(t, lvmtest.Options{Size: 512 * mib, PVs: 2})
	ctx := ctxFor(t)
	if _, err := c.Report(ctx); err != nil { // fills the extent-size cache
		t.Fatal(err)
	}
	tests := []struct {
		name string
		size uint64
		tags []string
		opts lvm.LVOptions
	}{
		{"carve-one-byte", 1, nil, lvm.LVOptions{}},
		{"carve-zero", 0, nil, lvm.LVOptions{}},
		{"carve-exact", 8 * mib, []string{"b", "a", "a"}, lvm.LVOptions{}},
		{"carve-odd", 8*mib + 1, []string{"carve.dev/class=x"}, lvm.LVOptions{}},
		{"carve-striped", 4 * mib, nil, lvm.LVOptions{Stripes: 2, StripeSize: 64 << 10}},
		{"carve-striped-odd", 13 * mib, nil, lvm.LVOptions{Stripes: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs.take()
			got, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: tt.name, Size: tt.size, Tags: tt.tags, Options: tt.opts})
			if err != nil {
				t.Fatal(err)
			}
			if cmds := obs.take(); !slices.Equal(cmds, []string{"lvcreate"}) {
				t.Errorf("create ran %v, want lvcreate only", cmds)
			}
			lv, err := c.GetLV(ctx, v.Name, tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if got.Size != lv.Size || got.Layout != lv.Layout || got.Path != lv.Path || got.Attr.Type != lv.Attr.Type ||
				!slices.Equal(got.Tags, lv.Tags) || got.Size < tt.size {
				t.Errorf("CreateLV said %+v\nLVM says     %+v", *got, *lv)
			}
		})
	}
}

func TestListAndFindByTag(t *testing.T) {
	v, c, _ := setup(t, lvmtest.Options{Size: 256 * mib})
	other, oc, _ := setup(t, lvmtest.Options{Size: 64 * mib})
	ctx := ctxFor(t)
	lvs := []struct {
		name string
		tags []string
	}{
		{"carve-a", []string{"carve.dev/owner=carve", "carve.dev/volume=61"}},
		{"carve-b", []string{"carve.dev/owner=carve", "carve.dev/volume=62"}},
		{"foreign", []string{"someone=else"}},
		{"untagged", nil},
	}
	for _, lv := range lvs {
		if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: lv.name, Size: 4 * mib, Tags: lv.tags}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := oc.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: other.Name, Name: "carve-c", Size: 4 * mib,
		Tags: []string{"carve.dev/owner=carve"}}); err != nil {
		t.Fatal(err)
	}
	// lvs @tag also names every LV of a VG that carries the tag: only the
	// LVs' own tags may count.
	if _, err := v.LVM(ctx, "vgchange", "--addtag", "carve.dev/owner=carve", v.Name); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		vg, tag string
		want    []string
	}{
		{v.Name, "carve.dev/owner=carve", []string{"carve-a", "carve-b"}},
		{"", "carve.dev/owner=carve", []string{"carve-a", "carve-b"}}, // the other VG is outside this client's lvm.conf
		{v.Name, "carve.dev/volume=62", []string{"carve-b"}},
		{v.Name, "someone=else", []string{"foreign"}},
		{v.Name, "nobody", []string{}},
		{"nosuchvg", "carve.dev/owner=carve", []string{}},
	}
	for _, tt := range tests {
		got, err := c.FindByTag(ctx, tt.vg, tt.tag)
		if err != nil {
			t.Fatal(err)
		}
		names := []string{}
		for _, lv := range got {
			names = append(names, lv.Name)
			if lv.VolumeGroup != v.Name || !slices.Contains(lv.Tags, tt.tag) {
				t.Errorf("FindByTag(%q) returned %+v", tt.tag, lv)
			}
		}
		slices.Sort(names)
		if !slices.Equal(names, tt.want) {
			t.Errorf("FindByTag(%q, %q) = %v, want %v", tt.vg, tt.tag, names, tt.want)
		}
	}
	all, err := c.ListLVs(ctx, v.Name)
	if err != nil || len(all) != len(lvs) {
		t.Errorf("ListLVs = %d LVs, %v; want %d", len(all), err, len(lvs))
	}
}

func TestInsufficientSpace(t *testing.T) {
	v, c, _ := setup(t, lvmtest.Options{Size: 64 * mib})
	ctx := ctxFor(t)
	vg := volumeGroup(t, ctx, c, v.Name)
	if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "too-big", Size: vg.Free + 1}); !errors.Is(err, lvm.ErrInsufficientSpace) {
		t.Fatalf("create of free+1 bytes = %v, want ErrInsufficientSpace", err)
	}
	// Exactly the free space fits.
	if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "all", Size: vg.Free}); err != nil {
		t.Fatalf("create of exactly the free space: %v", err)
	}
	if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "one-more", Size: 1}); !errors.Is(err, lvm.ErrInsufficientSpace) {
		t.Errorf("create in a full VG = %v, want ErrInsufficientSpace", err)
	}
	if _, err := c.ExtendLV(ctx, v.Name, "all", vg.Free+1); !errors.Is(err, lvm.ErrInsufficientSpace) {
		t.Errorf("extend past the VG = %v, want ErrInsufficientSpace", err)
	}
	lvs, err := c.ListLVs(ctx, v.Name)
	if err != nil || len(lvs) != 1 || lvs[0].Size != vg.Free {
		t.Errorf("after the failures: %+v, %v; want only the full-size LV", lvs, err)
	}
}

func TestAlreadyExists(t *testing.T) {
	v, c, _ := setup(t, lvmtest.Options{Size: 64 * mib})
	ctx := ctxFor(t)
	req := lvm.CreateRequest{VolumeGroup: v.Name, Name: "carve-dup", Size: 4 * mib, Tags: []string{"first"}}
	if _, err := c.CreateLV(ctx, req); err != nil {
		t.Fatal(err)
	}
	req.Tags = []string{"second"}
	req.Size = 8 * mib
	if _, err := c.CreateLV(ctx, req); !errors.Is(err, lvm.ErrAlreadyExists) {
		t.Fatalf("second create = %v, want ErrAlreadyExists", err)
	}
	lv, err := c.GetLV(ctx, v.Name, "carve-dup")
	if err != nil || lv.Size != 4*mib || !slices.Equal(lv.Tags, []string{"first"}) {
		t.Errorf("the first LV changed: %+v, %v", lv, err)
	}
}

func TestNotFound(t *testing.T) {
	v, c, _ := setup(t, lvmtest.Options{Size: 64 * mib})
	ctx := ctxFor(t)
	tests := []struct {
		name string
		call func() error
	}{
		{"GetLV", func() error { _, err := c.GetLV(ctx, v.Name, "nosuchlv"); return err }},
		{"GetLV no VG", func() error { _, err := c.GetLV(ctx, "nosuchvg", "lv"); return err }},
		{"RemoveLV", func() error { return c.RemoveLV(ctx, v.Name, "nosuchlv") }},
		{"RemoveLV no VG", func() error { return c.RemoveLV(ctx, "nosuchvg", "lv") }},
		{"ExtendLV", func() error { _, err := c.ExtendLV(ctx, v.Name, "nosuchlv", mib); return err }},
		{"VolumeGroup", func() error { _, err := c.VolumeGroup(ctx, "nosuchvg"); return err }},
		{"ListLVs", func() error { _, err := c.ListLVs(ctx, "nosuchvg"); return err }},
		{"CreateLV no VG", func() error {
			_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "nosuchvg", Name: "lv", Size: mib})
			return err
		}},
		{"CreateLV no thin pool", func() error {
			_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "lv", Size: mib, ThinPool: "nopool"})
			return err
		}},
		{"snapshot of nothing", func() error {
			_, err := c.CreateThinSnapshot(ctx, v.Name, "nosuchlv", "snap", nil)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, lvm.ErrNotFound) {
				t.Errorf("error %v, want ErrNotFound", err)
			}
		})
	}
}

func TestInvalidInputNeverReachesLVM(t *testing.T) {
	v, c, obs := setup(t, lvmtest.Options{Size: 64 * mib})
	ctx := ctxFor(t)
	tests := []struct {
		name string
		call func() error
	}{
		{"leading dash name", func() error {
			_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "-an", Size: mib})
			return err
		}},
		{"option as VG", func() error {
			_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "--help", Name: "lv", Size: mib})
			return err
		}},
		{"reserved name", func() error {
			_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "lv_tmeta", Size: mib})
			return err
		}},
		{"slash in name", func() error { return c.RemoveLV(ctx, v.Name, "../etc") }},
		{"space in tag", func() error {
			_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "lv", Size: mib, Tags: []string{"a b"}})
			return err
		}},
		{"selection injection", func() error { _, err := c.GetLV(ctx, v.Name, `x" || lv_name=~".*`); return err }},
		{"tag injection", func() error { _, err := c.FindByTag(ctx, v.Name, "a,b"); return err }},
		{"too long", func() error {
			_, err := c.ExtendLV(ctx, v.Name, string(make([]byte, 200)), mib)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obs.take()
			if err := tt.call(); !errors.Is(err, lvm.ErrInvalidArgument) {
				t.Errorf("error %v, want ErrInvalidArgument", err)
			}
			if cmds := obs.take(); len(cmds) != 0 {
				t.Errorf("ran %v", cmds)
			}
		})
	}
	// Options LVM would reject for this VG are classified from the VG's PV
	// count after lvcreate fails.
	_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "striped", Size: mib, Options: lvm.LVOptions{Stripes: 2}})
	if !errors.Is(err, lvm.ErrInvalidArgument) {
		t.Errorf("2 stripes on 1 PV = %v, want ErrInvalidArgument", err)
	}
}

func TestConcurrentCreatesOneVG(t *testing.T) {
	const n = 16
	v, c, _ := setup(t, lvmtest.Options{Size: 256 * mib})
	ctx := ctxFor(t)
	start := volumeGroup(t, ctx, c, v.Name)
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: fmt.Sprintf("carve-%02d", i),
				Size: 4 * mib, Tags: []string{fmt.Sprintf("carve.dev/volume=%02x", i)}})
			errs <- err
		}()
	}
	// Reads run meanwhile and see consistent states.
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.Report(ctx)
			if err == nil {
				vg := r.FindVG(v.Name)
				if vg == nil || vg.Free+uint64(len(r.LogicalVolumes))*4*mib != start.Free {
					err = fmt.Errorf("inconsistent report: %+v with %d LVs", vg, len(r.LogicalVolumes))
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	for len(errs) > 0 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	lvs, err := c.FindByTag(ctx, v.Name, "carve.dev/volume=0f")
	if err != nil || len(lvs) != 1 || lvs[0].Name != "carve-15" {
		t.Errorf("FindByTag(volume=0f) = %+v, %v", lvs, err)
	}
	mid, err := c.VolumeGroup(ctx, v.Name)
	if err != nil || start.Free-mid.Free != n*4*mib {
		t.Fatalf("after %d creates free went %d -> %d (%v), want %d MiB less", n, start.Free, mid.Free, err, n*4)
	}

	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.RemoveLV(ctx, v.Name, fmt.Sprintf("carve-%02d", i))
		}()
	}
	wg.Wait()
	for len(errs) > 0 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	left, err := c.ListLVs(ctx, v.Name)
	if err != nil || len(left) != 0 {
		t.Errorf("after removing all: %d LVs left (%v)", len(left), err)
	}
	end, err := c.VolumeGroup(ctx, v.Name)
	if err != nil || end.Free != start.Free {
		t.Errorf("free space %d at the end, want %d (leak)", end.Free, start.Free)
	}
}

func TestReportEmptyVG(t *testing.T) {
	v, c, obs := setup(t, lvmtest.Options{Size: 64 * mib})
	ctx := ctxFor(t)
	r, err := c.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cmds := obs.take(); !slices.Equal(cmds, []string{"fullreport"}) {
		t.Errorf("Report ran %v, want one fullreport", cmds)
	}
	vg := r.FindVG(v.Name)
	if vg == nil {
		t.Fatalf("empty VG %s missing from the report %+v", v.Name, r.VolumeGroups)
	}
	if vg.Free != vg.Size || vg.FreeExtents != vg.ExtentCount || vg.ExtentSize != 4*mib || vg.PVCount != 1 || vg.MissingPVs != 0 {
		t.Errorf("empty VG reads %+v", *vg)
	}
	if len(r.LogicalVolumes) != 0 || len(r.ThinPools) != 0 {
		t.Errorf("empty VG has LVs %+v pools %+v", r.LogicalVolumes, r.ThinPools)
	}
}

func TestReportMissingPV(t *testing.T) {
	v, c, _ := setup(t, lvmtest.Options{Size: 128 * mib, PVs: 2})
	ctx := ctxFor(t)
	vg := volumeGroup(t, ctx, c, v.Name)
	// Larger than one PV: it spans both.
	if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: "spans", Size: vg.Size/2 + 8*mib}); err != nil {
		t.Fatal(err)
	}
	if err := v.DetachPV(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r, err := c.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := r.FindVG(v.Name)
	if got == nil || got.MissingPVs != 1 || got.PVCount != 2 {
		t.Fatalf("VG with a detached PV reads %+v, want 1 of 2 PVs missing", got)
	}
	if lv := r.FindLV(v.Name, "spans"); lv == nil || lv.Attr.Health != lvm.HealthPartial {
		t.Errorf("LV on the missing PV reads %+v, want health partial", lv)
	}
}

// TestCreateOnPartialVGIsInsufficientSpace: in a volume group with a
// missing PV, an lvcreate larger than what the present PV has free (the
// space is really gone), and one that would fit there (LVM allocates
// nothing in a partial VG), both fail as ErrInsufficientSpace, which the
// driver answers with RESOURCE_EXHAUSTED so the pod goes to another node.
func TestCreateOnPartialVGIsInsufficientSpace(t *testing.T) {
	v, c, _ := setup(t, lvmtest.Options{Size: 128 * mib, PVs: 2})
	ctx := ctxFor(t)
	vg := volumeGroup(t, ctx, c, v.Name)
	if err := v.DetachPV(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		size uint64
	}{
		{"gone", vg.Size/2 + 8*mib},
		{"would-fit", 8 * mib},
	} {
		_, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: tc.name, Size: tc.size})
		if !errors.Is(err, lvm.ErrInsufficientSpace) {
			t.Errorf("CreateLV of %d bytes in a VG with a missing PV = %v, want ErrInsufficientSpace", tc.size, err)
		}
	}
}

// TestArchiveKeepsRetainMin: with LVM's defaults (retain_days 30) each
// metadata change adds a file to the VG's archive, for a month; carve's
// changes pass backup/retain_days=0, so that the archive shrinks to
// retain_min (10 by default) newest files at carve's next change and
// stays there.
func TestArchiveKeepsRetainMin(t *testing.T) {
	v, c, _ := setup(t, lvmtest.Options{Size: 64 * mib})
	ctx := ctxFor(t)
	archived := func() int {
		t.Helper()
		files, err := filepath.Glob(filepath.Join(v.ConfigDir, "archive", v.Name+"_*.vg"))
		if err != nil {
			t.Fatal(err)
		}
		return len(files)
	}
	// The control: LVM's own defaults keep every change.
	for i := range 8 {
		name := fmt.Sprint("raw", i)
		if _, err := v.LVM(ctx, "lvcreate", "--yes", "--name", name, "--size", "4m", v.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := v.LVM(ctx, "lvremove", "--yes", v.Name+"/"+name); err != nil {
			t.Fatal(err)
		}
	}
	if n := archived(); n < 16 {
		t.Fatalf("16 changes with LVM's defaults left %d archive files; the test expects LVM to keep them all", n)
	}
	for i := range 3 {
		name := fmt.Sprint("carve", i)
		if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: name, Size: 4 * mib}); err != nil {
			t.Fatal(err)
		}
		if err := c.RemoveLV(ctx, v.Name, name); err != nil {
			t.Fatal(err)
		}
		if n := archived(); n > 10 {
			t.Errorf("after carve's change %d the archive holds %d files, want at most retain_min (10)", 2*i+2, n)
		}
	}
}
