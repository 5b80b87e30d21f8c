package lvm

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReportIsOneCommand(t *testing.T) {
	f := loadFake(t, "fullreport-thin.json")
	c := f.client()
	before := time.Now()
	r, err := c.Report(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := f.commands(); !slices.Equal(got, []string{"fullreport"}) {
		t.Errorf("commands %v, want one fullreport", got)
	}
	if len(r.VolumeGroups) != 1 || len(r.LogicalVolumes) != 8 || len(r.ThinPools) != 1 {
		t.Errorf("report has %d VGs, %d LVs, %d pools; want 1, 8, 1", len(r.VolumeGroups), len(r.LogicalVolumes), len(r.ThinPools))
	}
	if r.ReadAt.Before(before) || r.ReadAt.After(time.Now()) {
		t.Errorf("ReadAt %v is not the time of the read", r.ReadAt)
	}
	// The report filled the extent-size cache: a create needs no VG read.
	f.resetCalls()
	if _, err := c.CreateLV(context.Background(), CreateRequest{VolumeGroup: "rec-thin", Name: "new", Size: 1}); err != nil {
		t.Fatal(err)
	}
	if got := f.commands(); !slices.Equal(got, []string{"lvcreate"}) {
		t.Errorf("create after a report ran %v, want only lvcreate", got)
	}
}

func TestCreateLVSuccess(t *testing.T) {
	tests := []struct {
		name string
		req  CreateRequest
		want LogicalVolume
	}{
		{"thick rounded up", CreateRequest{VolumeGroup: "rec-thick", Name: "carve-1", Size: 10 << 20, Tags: []string{"z", "a"}},
			LogicalVolume{Name: "carve-1", VolumeGroup: "rec-thick", Size: 12 << 20, Tags: []string{"a", "z"},
				Attr: Attributes{Type: TypeThick, Health: HealthOK}, Path: "/dev/rec-thick/carve-1", Layout: "linear"}},
		{"zero size is one extent", CreateRequest{VolumeGroup: "rec-thick", Name: "carve-2"},
			LogicalVolume{Name: "carve-2", VolumeGroup: "rec-thick", Size: 4 << 20,
				Attr: Attributes{Type: TypeThick, Health: HealthOK}, Path: "/dev/rec-thick/carve-2", Layout: "linear"}},
		{"striped", CreateRequest{VolumeGroup: "rec-thick", Name: "carve-3", Size: 4 << 20, Options: LVOptions{Stripes: 2}},
			LogicalVolume{Name: "carve-3", VolumeGroup: "rec-thick", Size: 8 << 20,
				Attr: Attributes{Type: TypeThick, Health: HealthOK}, Path: "/dev/rec-thick/carve-3", Layout: "striped"}},
		{"thin", CreateRequest{VolumeGroup: "rec-thick", Name: "carve-4", Size: 1<<30 + 1, ThinPool: "pool0"},
			LogicalVolume{Name: "carve-4", VolumeGroup: "rec-thick", Size: 1<<30 + 4<<20, Pool: "pool0",
				Attr: Attributes{Type: TypeThin, Health: HealthOK}, Path: "/dev/rec-thick/carve-4", Layout: "thin,sparse"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, "fullreport-thick.json")
			c := f.client()
			ctx := context.Background()
			// Cold: the VG's extent size is read once.
			lv, err := c.CreateLV(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*lv, tt.want) {
				t.Errorf("result\n got %+v\nwant %+v", *lv, tt.want)
			}
			if got := f.commands(); !slices.Equal(got, []string{"vgs", "lvcreate"}) {
				t.Errorf("first create ran %v, want vgs, lvcreate", got)
			}
			// Warm: one lvcreate and nothing else.
			f.resetCalls()
			req := tt.req
			req.Name += "x"
			if _, err := c.CreateLV(ctx, req); err != nil {
				t.Fatal(err)
			}
			if got := f.commands(); !slices.Equal(got, []string{"lvcreate"}) {
				t.Errorf("second create ran %v, want only lvcreate", got)
			}
		})
	}
}

func TestCreateLVMissingVGCold(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	_, err := f.client().CreateLV(context.Background(), CreateRequest{VolumeGroup: "nosuchvg", Name: "x"})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("error %v, want ErrNotFound", err)
	}
	if got := f.commands(); !slices.Equal(got, []string{"vgs"}) {
		t.Errorf("commands %v, want only the vgs that found no VG", got)
	}
}

func TestRemoveLVIsOneCommand(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	if err := f.client().RemoveLV(context.Background(), "rec-thick", "plain"); err != nil {
		t.Fatal(err)
	}
	if got := f.commands(); !slices.Equal(got, []string{"lvremove"}) {
		t.Errorf("remove ran %v, want only lvremove", got)
	}
}

// failWith answers every mutation with a recorded failure.
func failWith(o output) func([]string) output { return func([]string) output { return o } }

func TestCreateLVFailures(t *testing.T) {
	rec := recordedFailures(t, "failures-host.json")
	tests := []struct {
		name string
		req  CreateRequest
		fail output
		want error // nil: unclassified
		text string
	}{
		{"name taken", CreateRequest{VolumeGroup: "rec-thick", Name: "carve-aaaa", Size: 12 << 20},
			rec["create-exists"].output(), ErrAlreadyExists, "the name is taken"},
		{"no VG", CreateRequest{VolumeGroup: "nosuchvg", Name: "x", Size: 4 << 20},
			rec["create-no-vg"].output(), ErrVolumeGroupNotFound, "volume group does not exist"},
		{"no space", CreateRequest{VolumeGroup: "rec-thick", Name: "big", Size: 4 << 30},
			rec["create-no-space"].output(), ErrInsufficientSpace, "248 free extents, 1024 needed"},
		{"raid1 copies do not fit", CreateRequest{VolumeGroup: "rec-thick", Name: "r", Size: 512 << 20, Options: LVOptions{Mirrors: 1}},
			output{ExitCode: 5}, ErrInsufficientSpace, "248 free extents, 258 needed"},
		{"more stripes than PVs", CreateRequest{VolumeGroup: "rec-thick", Name: "s3", Size: 12 << 20, Options: LVOptions{Stripes: 3}},
			rec["create-stripes-pvs"].output(), ErrInvalidArgument, "3 stripes need 3 physical volumes"},
		{"command line rejected", CreateRequest{VolumeGroup: "rec-thick", Name: "lv", Size: 4 << 20},
			rec["create-bad-name"].output(), ErrInvalidArgument, "rejected the command line"},
		{"no thin pool", CreateRequest{VolumeGroup: "rec-thick", Name: "t", Size: 4 << 20, ThinPool: "nopool"},
			output{ExitCode: 5}, ErrNotFound, "thin pool nopool does not exist"},
		{"allocation message with free space", CreateRequest{VolumeGroup: "rec-thick", Name: "s2", Size: 12 << 20, Options: LVOptions{Stripes: 2}},
			output{ExitCode: 5, Stderr: []byte("  Insufficient suitable allocatable extents for logical volume s2: 4 more required\n")},
			ErrInsufficientSpace, "too little allocatable space"},
		{"unknown failure", CreateRequest{VolumeGroup: "rec-thick", Name: "lv", Size: 4 << 20},
			output{ExitCode: 5, Stderr: []byte("  Something new went wrong\n")}, nil, "Something new went wrong"},
	}
	for _, tt := range tests {
		for _, withText := range []bool{true, false} {
			name := tt.name
			fail := tt.fail
			if !withText {
				// Facts, not messages: with stderr gone the data-based
				// classifications stay the same.
				if strings.Contains(tt.text, "allocatable space") || tt.want == nil {
					continue
				}
				name += " without stderr"
				fail.Stderr = nil
			}
			t.Run(name, func(t *testing.T) {
				f := loadFake(t, "fullreport-thick.json")
				f.mutate = failWith(fail)
				c := f.client()
				// A VG read earlier (its extent size cached), so that
				// lvcreate runs even for a VG that is gone since.
				c.remember([]VolumeGroup{{Name: tt.req.VolumeGroup, ExtentSize: 4 << 20}})
				_, err := c.CreateLV(context.Background(), tt.req)
				checkKind(t, err, tt.want, tt.text)
				// One read of the VG explains the failure; a VG that is
				// gone takes a second (vgs), to tell missing from unreadable.
				want := []string{"lvcreate", "fullreport"}
				if tt.want == ErrVolumeGroupNotFound { //nolint:errorlint // which sentinel the table or the kind names, not a wrapped error
					want = append(want, "vgs")
				}
				if got := f.commands(); !slices.Equal(got, want) && !slices.Equal(got, []string{"lvcreate"}) {
					t.Errorf("commands %v, want %v or lvcreate alone", got, want)
				}
			})
		}
	}
}

// checkKind asserts err is a classified (or, want nil, unclassified)
// *CommandError whose message says text.
func checkKind(t *testing.T, err error, want error, text string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	var ce *CommandError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v carries no *CommandError", err)
	}
	if ce.Kind != want { //nolint:errorlint // which sentinel the table or the kind names, not a wrapped error
		t.Errorf("Kind = %v, want %v (error: %v)", ce.Kind, want, err)
	}
	if want != nil && !errors.Is(err, want) {
		t.Errorf("errors.Is(%v, %v) = false", err, want)
	}
	for _, other := range []error{ErrNotFound, ErrVolumeGroupNotFound, ErrAlreadyExists, ErrInsufficientSpace, ErrInvalidArgument, ErrInUse} {
		if other != want && !errors.Is(want, other) && errors.Is(err, other) { //nolint:errorlint // which sentinel the table or the kind names, not a wrapped error
			t.Errorf("error %v is also %v", err, other)
		}
	}
	if !strings.Contains(err.Error(), text) {
		t.Errorf("error %q does not say %q", err, text)
	}
}

func TestRemoveLVFailures(t *testing.T) {
	rec := recordedFailures(t, "failures-host.json")
	tests := []struct {
		name, vg, lv string
		openLV       bool
		fail         output
		want         error
		text         string
	}{
		{"no LV", "rec-thick", "nosuchlv", false, rec["remove-no-lv"].output(), ErrNotFound, "logical volume does not exist"},
		{"no VG", "nosuchvg", "x", false, rec["remove-no-vg"].output(), ErrVolumeGroupNotFound, "volume group does not exist"},
		{"open", "rec-thick", "plain", true, output{ExitCode: 5, Stderr: []byte("  Logical volume rec-thick/plain contains a filesystem in use.\n")}, ErrInUse, "is open"},
		{"unknown", "rec-thick", "plain", false, output{ExitCode: 5, Stderr: []byte("  odd\n")}, nil, "odd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, "fullreport-thick.json")
			if tt.openLV {
				f.setAttr(tt.vg, tt.lv, "-wi-ao----")
			}
			f.mutate = failWith(tt.fail)
			err := f.client().RemoveLV(context.Background(), tt.vg, tt.lv)
			checkKind(t, err, tt.want, tt.text)
			// The only extra reads are on the failure path: one of the
			// VG, and a vgs when the VG is gone.
			want := []string{"lvremove", "fullreport"}
			if tt.want == ErrVolumeGroupNotFound { //nolint:errorlint // which sentinel the table or the kind names, not a wrapped error
				want = append(want, "vgs")
			}
			if got := f.commands(); !slices.Equal(got, want) {
				t.Errorf("commands %v, want %v", got, want)
			}
		})
	}
}

func TestExtendLV(t *testing.T) {
	rec := recordedFailures(t, "failures-host.json")
	tests := []struct {
		name     string
		lv       string
		size     uint64
		fail     *output
		wantSize uint64
		wantCmds []string
		want     error
		text     string
	}{
		{"already large enough", "carve-aaaa", 10 << 20, nil, 12 << 20, []string{"lvs"}, nil, ""},
		{"same size", "carve-aaaa", 12 << 20, nil, 12 << 20, []string{"lvs"}, nil, ""},
		{"grows, rounded", "plain", 5 << 20, nil, 8 << 20, []string{"lvs", "vgs", "lvextend"}, nil, ""},
		{"striped is read back", "striped", 9 << 20, nil, 8 << 20, []string{"lvs", "vgs", "lvextend", "lvs"}, nil, ""},
		{"no space", "plain", 4 << 30, ptr(rec["extend-no-space"].output()), 0, []string{"lvs", "vgs", "lvextend", "fullreport"},
			ErrInsufficientSpace, "248 free extents, 1023 needed"},
		{"unknown failure", "plain", 8 << 20, &output{ExitCode: 5, Stderr: []byte("  odd\n")}, 0,
			[]string{"lvs", "vgs", "lvextend", "fullreport"}, nil, "odd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, "fullreport-thick.json")
			if tt.fail != nil {
				f.mutate = failWith(*tt.fail)
			}
			lv, err := f.client().ExtendLV(context.Background(), "rec-thick", tt.lv, tt.size)
			if got := f.commands(); !slices.Equal(got, tt.wantCmds) {
				t.Errorf("commands %v, want %v", got, tt.wantCmds)
			}
			if tt.fail != nil {
				checkKind(t, err, tt.want, tt.text)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if lv.Size != tt.wantSize || lv.Name != tt.lv {
				t.Errorf("got %s of %d bytes, want %s of %d", lv.Name, lv.Size, tt.lv, tt.wantSize)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestExtendLVNotFound(t *testing.T) {
	tests := []struct{ vg, lv string }{{"rec-thick", "nosuchlv"}, {"nosuchvg", "lv"}}
	for _, tt := range tests {
		f := loadFake(t, "fullreport-thick.json")
		_, err := f.client().ExtendLV(context.Background(), tt.vg, tt.lv, 1<<30)
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("ExtendLV(%s/%s) = %v, want ErrNotFound", tt.vg, tt.lv, err)
		}
		if slices.Contains(f.commands(), "lvextend") {
			t.Errorf("lvextend ran for a missing LV")
		}
	}
}

func TestReads(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	c := f.client()
	ctx := context.Background()

	lv, err := c.GetLV(ctx, "rec-thick", "carve-aaaa")
	if err != nil || lv.Size != 12<<20 || len(lv.Tags) != 3 {
		t.Errorf("GetLV = %+v, %v", lv, err)
	}
	for _, name := range [][2]string{{"rec-thick", "nosuchlv"}, {"nosuchvg", "x"}} {
		if _, err := c.GetLV(ctx, name[0], name[1]); !errors.Is(err, ErrNotFound) {
			t.Errorf("GetLV(%s/%s) = %v, want ErrNotFound", name[0], name[1], err)
		}
	}
	vg, err := c.VolumeGroup(ctx, "rec-thick")
	if err != nil || vg.FreeExtents != 248 {
		t.Errorf("VolumeGroup = %+v, %v", vg, err)
	}
	if _, err := c.VolumeGroup(ctx, "nosuchvg"); !errors.Is(err, ErrNotFound) {
		t.Errorf("VolumeGroup(nosuchvg) = %v, want ErrNotFound", err)
	}
	lvs, err := c.ListLVs(ctx, "rec-empty")
	if err != nil || len(lvs) != 0 {
		t.Errorf("ListLVs(rec-empty) = %v, %v", lvs, err)
	}
	if _, err := c.ListLVs(ctx, "nosuchvg"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ListLVs(nosuchvg) = %v, want ErrNotFound", err)
	}
	all, err := c.ListLVs(ctx, "")
	if err != nil || len(all) != 3 {
		t.Errorf("ListLVs(all) = %d LVs, %v; want 3", len(all), err)
	}
}

func TestFindByTag(t *testing.T) {
	tests := []struct {
		vg, tag string
		want    []string
	}{
		{"", "carve.dev/owner=carve", []string{"carve-aaaa", "striped"}},
		{"rec-thick", "carve.dev/owner=carve", []string{"carve-aaaa", "striped"}},
		{"rec-empty", "carve.dev/owner=carve", []string{}},
		{"", "carve.dev/class=fast", []string{"carve-aaaa"}},
		{"", "nobody-has-this", []string{}},
	}
	for _, tt := range tests {
		f := loadFake(t, "fullreport-thick.json")
		// A VG tag makes LVM name every LV of the VG; only LV tags count.
		for i := range f.vgs {
			f.vgs[i].Tags = "carve.dev/owner=carve,carve.dev/class=fast"
		}
		lvs, err := f.client().FindByTag(context.Background(), tt.vg, tt.tag)
		if err != nil {
			t.Fatal(err)
		}
		names := []string{}
		for _, lv := range lvs {
			names = append(names, lv.Name)
		}
		if lvs == nil || !slices.Equal(names, tt.want) {
			t.Errorf("FindByTag(%q, %q) = %v (nil: %v), want %v", tt.vg, tt.tag, names, lvs == nil, tt.want)
		}
		if got := f.commands(); !slices.Equal(got, []string{"lvs"}) {
			t.Errorf("commands %v, want one lvs", got)
		}
	}
}

// TestCreateSnapshotKnownOrigin: an origin the caller read already is not
// read again, so a snapshot costs one lvcreate; a copy-on-write snapshot
// reports its copy-on-write space as its size.
func TestCreateSnapshotKnownOrigin(t *testing.T) {
	ctx := context.Background()
	f := loadFake(t, "fullreport-thin.json")
	f.mutate = func(args []string) output { return output{} }
	thin := &LogicalVolume{Name: "thin1", VolumeGroup: "rec-thin", Size: 64 << 20, Pool: "pool0",
		Attr: Attributes{Type: TypeThin}, Layout: "thin,sparse"}
	snap, err := f.client().CreateSnapshot(ctx, SnapshotRequest{VolumeGroup: "rec-thin", Origin: "thin1", Name: "s1",
		OriginLV: thin, ActivationSkip: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.commands(); !slices.Equal(got, []string{"lvcreate"}) {
		t.Errorf("commands %v, want one lvcreate", got)
	}
	if snap.Size != 64<<20 || snap.Pool != "pool0" || !snap.Attr.ActivationSkip || snap.Attr.Type != TypeThin {
		t.Errorf("thin snapshot %+v", *snap)
	}

	f.resetCalls()
	cow, err := f.client().CreateSnapshot(ctx, SnapshotRequest{VolumeGroup: "rec-thin", Origin: "thick1", Name: "s2", CowSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if cow.Attr.Type != TypeSnapshot || cow.Size%(4<<20) != 0 || cow.Size < 5<<20 || cow.Pool != "" {
		t.Errorf("copy-on-write snapshot %+v: want its space, whole extents, as its size", *cow)
	}
	_, err = f.client().CreateSnapshot(ctx, SnapshotRequest{VolumeGroup: "rec-thin", Origin: "thin1", Name: "s3", CowSize: 5 << 20})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("copy-on-write snapshot of a thin LV: %v, want ErrInvalidArgument", err)
	}
}

func TestCreateThinSnapshot(t *testing.T) {
	ctx := context.Background()
	f := loadFake(t, "fullreport-thin.json")
	var got []string
	f.mutate = func(args []string) output { got = args; return output{} }
	snap, err := f.client().CreateThinSnapshot(ctx, "rec-thin", "thin1", "carve-snap", []string{"t"})
	if err != nil {
		t.Fatal(err)
	}
	want := LogicalVolume{Name: "carve-snap", VolumeGroup: "rec-thin", Size: 64 << 20, Tags: []string{"t"},
		Attr: Attributes{Type: TypeThin, Health: HealthOK}, Pool: "pool0", Origin: "thin1",
		Path: "/dev/rec-thin/carve-snap", Layout: "thin,sparse"}
	if snap.Time.IsZero() {
		t.Error("snapshot has no time")
	}
	snap.Time = time.Time{}
	if !reflect.DeepEqual(*snap, want) {
		t.Errorf("snapshot\n got %+v\nwant %+v", *snap, want)
	}
	if !slices.Equal(got, withMutationConfig(snapshotArgs(SnapshotRequest{VolumeGroup: "rec-thin", Origin: "thin1", Name: "carve-snap", Tags: []string{"t"}}, 0))) {
		t.Errorf("ran %q", got)
	}

	tests := []struct {
		origin, name string
		fail         *output
		want         error
	}{
		{"thick1", "s1", nil, ErrInvalidArgument},
		{"nosuch", "s1", nil, ErrNotFound},
		{"thin1", "snap1", &output{ExitCode: 5}, ErrAlreadyExists},
		{"thin1", "-s", nil, ErrInvalidArgument},
	}
	for _, tt := range tests {
		f := loadFake(t, "fullreport-thin.json")
		if tt.fail != nil {
			f.mutate = failWith(*tt.fail)
		}
		_, err := f.client().CreateThinSnapshot(ctx, "rec-thin", tt.origin, tt.name, nil)
		if !errors.Is(err, tt.want) {
			t.Errorf("snapshot %s of %s: %v, want %v", tt.name, tt.origin, err, tt.want)
		}
		if tt.fail == nil && slices.Contains(f.commands(), "lvcreate") {
			t.Errorf("snapshot %s of %s ran lvcreate", tt.name, tt.origin)
		}
	}
}

func TestThinFailures(t *testing.T) {
	// Recorded in the guest, where thin pools exist.
	rec := recordedFailures(t, "failures-thin.json")
	ctx := context.Background()
	tests := []struct {
		name string
		call func(c *Client) error
		fail output
		pool func(f *fakeLVM)
		want error
		text string
	}{
		{"thin LV in a missing pool", func(c *Client) error {
			_, err := c.CreateLV(ctx, CreateRequest{VolumeGroup: "rec-thin", Name: "t9", Size: 4 << 20, ThinPool: "nopool"})
			return err
		}, rec["thin-create-no-pool"].output(), nil, ErrNotFound, "thin pool nopool does not exist"},
		{"snapshot name taken", func(c *Client) error {
			_, err := c.CreateThinSnapshot(ctx, "rec-thin", "thin1", "snap1", nil)
			return err
		}, rec["snapshot-exists"].output(), nil, ErrAlreadyExists, "the name is taken"},
		{"thin LV in a full pool", func(c *Client) error {
			_, err := c.CreateLV(ctx, CreateRequest{VolumeGroup: "rec-thin", Name: "t9", Size: 4 << 20, ThinPool: "pool0"})
			return err
		}, output{ExitCode: 5}, func(f *fakeLVM) {
			for i := range f.lvs {
				if f.lvs[i].Name == "pool0" {
					f.lvs[i].DataPercent = "100.00"
				}
			}
		}, ErrInsufficientSpace, "thin pool pool0 is full"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, "fullreport-thin.json")
			if tt.pool != nil {
				tt.pool(f)
			}
			f.mutate = failWith(tt.fail)
			checkKind(t, tt.call(f.client()), tt.want, tt.text)
		})
	}
}

// TestInvalidInputRunsNothing: a bad name, tag or option is an
// ErrInvalidArgument and never reaches an lvm command line.
func TestInvalidInputRunsNothing(t *testing.T) {
	ctx := context.Background()
	calls := []struct {
		name string
		call func(c *Client) error
	}{
		{"create bad vg", func(c *Client) error {
			_, err := c.CreateLV(ctx, CreateRequest{VolumeGroup: "--all", Name: "lv"})
			return err
		}},
		{"create bad name", func(c *Client) error {
			_, err := c.CreateLV(ctx, CreateRequest{VolumeGroup: "vg", Name: "-n"})
			return err
		}},
		{"create bad tag", func(c *Client) error {
			_, err := c.CreateLV(ctx, CreateRequest{VolumeGroup: "vg", Name: "lv", Tags: []string{"a b"}})
			return err
		}},
		{"create bad options", func(c *Client) error {
			_, err := c.CreateLV(ctx, CreateRequest{VolumeGroup: "vg", Name: "lv", Options: LVOptions{Stripes: 999}})
			return err
		}},
		{"extend", func(c *Client) error { _, err := c.ExtendLV(ctx, "vg", "../x", 1); return err }},
		{"remove", func(c *Client) error { return c.RemoveLV(ctx, "vg x", "lv") }},
		{"get", func(c *Client) error { _, err := c.GetLV(ctx, "vg", "lv\"x"); return err }},
		{"list", func(c *Client) error { _, err := c.ListLVs(ctx, "-vg"); return err }},
		{"tag", func(c *Client) error { _, err := c.FindByTag(ctx, "", "x y"); return err }},
		{"tag vg", func(c *Client) error { _, err := c.FindByTag(ctx, "..", "x"); return err }},
		{"vg", func(c *Client) error { _, err := c.VolumeGroup(ctx, ""); return err }},
		{"snapshot", func(c *Client) error { _, err := c.CreateThinSnapshot(ctx, "vg", "o", "snapshot1", nil); return err }},
	}
	for _, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, "fullreport-thick.json")
			if err := tt.call(f.client()); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("error %v, want ErrInvalidArgument", err)
			}
			if got := f.commands(); len(got) != 0 {
				t.Errorf("ran %v", got)
			}
		})
	}
}

func TestContextErrorsAreNotClassified(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	f.mutate = func([]string) output { return output{ExitCode: -1} }
	c := newClient(Options{}, runnerFunc(func(ctx context.Context, args []string) (output, error) {
		if args[0] == "lvcreate" {
			f.mu.Lock()
			f.calls = append(f.calls, args)
			f.mu.Unlock()
			return output{ExitCode: -1}, context.DeadlineExceeded
		}
		return f.run(ctx, args)
	}), nil)
	_, err := c.CreateLV(context.Background(), CreateRequest{VolumeGroup: "rec-thick", Name: "lv", Size: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want DeadlineExceeded", err)
	}
	for _, kind := range []error{ErrNotFound, ErrAlreadyExists, ErrInsufficientSpace, ErrInvalidArgument} {
		if errors.Is(err, kind) {
			t.Errorf("a stopped command was classified %v", kind)
		}
	}
	if got := f.commands(); !slices.Equal(got, []string{"vgs", "lvcreate"}) {
		t.Errorf("commands %v: no classification read after a stopped command", got)
	}
}

type recordingObserver struct {
	commands []string
	errs     []error
}

func (o *recordingObserver) ObserveCommand(command string, d time.Duration, err error) {
	o.commands = append(o.commands, command)
	o.errs = append(o.errs, err)
}

func TestObserverSeesEveryCommand(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	obs := &recordingObserver{}
	c := newClient(Options{Observer: obs}, runnerFunc(f.run), nil)
	ctx := context.Background()
	_, _ = c.Report(ctx)
	f.mutate = failWith(output{ExitCode: 5})
	_ = c.RemoveLV(ctx, "rec-thick", "plain")
	want := []string{"fullreport", "lvremove", "fullreport"}
	if !slices.Equal(obs.commands, want) {
		t.Fatalf("observed %v, want %v", obs.commands, want)
	}
	if obs.errs[0] != nil || obs.errs[1] == nil || obs.errs[2] != nil {
		t.Errorf("observed errors %v, want only lvremove's", obs.errs)
	}
}

func TestDeleteTags(t *testing.T) {
	rec := recordedFailures(t, "failures-host.json")
	tests := []struct {
		name, vg, lv string
		fail         *output
		want         error
		commands     []string
	}{
		{"ok", "rec-thick", "plain", nil, nil, []string{"lvchange"}},
		{"no LV", "rec-thick", "nosuchlv", &output{ExitCode: 5, Stderr: []byte("  Failed to find logical volume \"rec-thick/nosuchlv\"\n")}, ErrNotFound, []string{"lvchange", "fullreport"}},
		{"no VG", "nosuchvg", "x", ptr(rec["remove-no-vg"].output()), ErrVolumeGroupNotFound, []string{"lvchange", "fullreport", "vgs"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, "fullreport-thick.json")
			if tt.fail != nil {
				f.mutate = failWith(*tt.fail)
			}
			err := f.client().DeleteTags(context.Background(), tt.vg, tt.lv, "carve.dev/unfinished")
			if tt.want == nil && err != nil {
				t.Fatal(err)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("DeleteTags = %v, want %v", err, tt.want)
			}
			if got := f.commands(); !slices.Equal(got, tt.commands) {
				t.Errorf("commands %v, want %v", got, tt.commands)
			}
		})
	}
	if err := (&Client{}).DeleteTags(context.Background(), "vg", "lv"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("DeleteTags without a tag = %v, want ErrInvalidArgument", err)
	}
}

// TestRenameLV: a failed lvrename is classified from LVM state: the LV
// gone, the new name taken.
func TestRenameLV(t *testing.T) {
	fail := &output{ExitCode: 5, Stderr: []byte("  lvrename failed\n")}
	tests := []struct {
		name, lv, to string
		fail         *output
		want         error
		commands     []string
	}{
		{"ok", "carve-aaaa", "carve-orphan-aaaa", nil, nil, []string{"lvrename"}},
		{"no LV", "nosuchlv", "other", fail, ErrNotFound, []string{"lvrename", "fullreport"}},
		{"name taken", "carve-aaaa", "plain", fail, ErrAlreadyExists, []string{"lvrename", "fullreport"}},
		{"bad name", "carve-aaaa", "-x", nil, ErrInvalidArgument, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, "fullreport-thick.json")
			if tt.fail != nil {
				f.mutate = failWith(*tt.fail)
			}
			err := f.client().RenameLV(context.Background(), "rec-thick", tt.lv, tt.to)
			if tt.want == nil && err != nil {
				t.Fatal(err)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("RenameLV = %v, want %v", err, tt.want)
			}
			if got := f.commands(); !slices.Equal(got, tt.commands) {
				t.Errorf("commands %v, want %v", got, tt.commands)
			}
		})
	}
}

func TestChangeTags(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	if err := f.client().ChangeTags(context.Background(), "rec-thick", "plain", []string{"a=1"}, []string{"b=2"}); err != nil {
		t.Fatal(err)
	}
	if got := f.commands(); !slices.Equal(got, []string{"lvchange"}) {
		t.Errorf("commands %v, want one lvchange", got)
	}
	for _, bad := range [][2][]string{{nil, nil}, {{"bad tag!"}, nil}} {
		if err := f.client().ChangeTags(context.Background(), "rec-thick", "plain", bad[0], bad[1]); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ChangeTags(%q, %q) = %v, want ErrInvalidArgument", bad[0], bad[1], err)
		}
	}
}
