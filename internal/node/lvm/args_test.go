package lvm

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestCreateArgs(t *testing.T) {
	tests := []struct {
		name string
		req  CreateRequest
		size uint64
		want []string
	}{
		{"thick", CreateRequest{VolumeGroup: "vg0", Name: "lv1"}, 4 << 20,
			[]string{"lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y", "--name", "lv1", "--size", "4194304b", "vg0"}},
		{"thick with tags", CreateRequest{VolumeGroup: "vg0", Name: "lv1", Tags: []string{"a=b", "-c"}}, 8 << 20,
			[]string{"lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y", "--name", "lv1", "--size", "8388608b",
				"--addtag", "a=b", "--addtag", "-c", "vg0"}},
		{"striped", CreateRequest{VolumeGroup: "vg0", Name: "lv1", Options: LVOptions{Stripes: 2}}, 8 << 20,
			[]string{"lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y", "--name", "lv1", "--size", "8388608b",
				"--stripes", "2", "vg0"}},
		{"striped with size", CreateRequest{VolumeGroup: "vg0", Name: "lv1", Options: LVOptions{Stripes: 3, StripeSize: 64 << 10}}, 12 << 20,
			[]string{"lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y", "--name", "lv1", "--size", "12582912b",
				"--stripes", "3", "--stripesize", "65536b", "vg0"}},
		{"stripes 1 is linear", CreateRequest{VolumeGroup: "vg0", Name: "lv1", Options: LVOptions{Stripes: 1}}, 4 << 20,
			[]string{"lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y", "--name", "lv1", "--size", "4194304b", "vg0"}},
		{"raid1", CreateRequest{VolumeGroup: "vg0", Name: "lv1", Options: LVOptions{Mirrors: 1}}, 4 << 20,
			[]string{"lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y", "--name", "lv1", "--size", "4194304b",
				"--type", "raid1", "--mirrors", "1", "vg0"}},
		{"thin", CreateRequest{VolumeGroup: "vg0", Name: "lv1", ThinPool: "pool0", Tags: []string{"t"}}, 1 << 30,
			[]string{"lvcreate", "--yes", "--type", "thin", "--name", "lv1", "--virtualsize", "1073741824b",
				"--thinpool", "pool0", "--addtag", "t", "vg0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := createArgs(tt.req, tt.size); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("createArgs =\n %q\nwant\n %q", got, tt.want)
			}
		})
	}
}

func TestMutationArgs(t *testing.T) {
	tests := []struct {
		name string
		got  []string
		want []string
	}{
		{"snapshot", snapshotArgs(SnapshotRequest{VolumeGroup: "vg0", Origin: "thin1", Name: "snap1", Tags: []string{"a", "b"}}, 0),
			[]string{"lvcreate", "--yes", "--snapshot", "--setactivationskip", "n", "--name", "snap1",
				"--addtag", "a", "--addtag", "b", "vg0/thin1"}},
		{"snapshot kept inactive", snapshotArgs(SnapshotRequest{VolumeGroup: "vg0", Origin: "thin1", Name: "snap1", ActivationSkip: true}, 0),
			[]string{"lvcreate", "--yes", "--snapshot", "--setactivationskip", "y", "--name", "snap1", "vg0/thin1"}},
		{"copy-on-write snapshot", snapshotArgs(SnapshotRequest{VolumeGroup: "vg0", Origin: "lv1", Name: "snap1", ActivationSkip: true}, 8<<20),
			[]string{"lvcreate", "--yes", "--snapshot", "--size", "8388608b", "--name", "snap1", "vg0/lv1"}},
		{"extend", extendArgs("vg0", "lv1", 16<<20), []string{"lvextend", "--size", "16777216b", "vg0/lv1"}},
		{"remove", removeArgs("vg0", "lv1"), []string{"lvremove", "--yes", "vg0/lv1"}},
		{"delete tags", delTagsArgs("vg0", "lv1", []string{"a", "b=c"}), []string{"lvchange", "--deltag", "a", "--deltag", "b=c", "vg0/lv1"}},
		{"change tags", changeTagsArgs("vg0", "lv1", []string{"n=1"}, []string{"o=0"}), []string{"lvchange", "--deltag", "o=0", "--addtag", "n=1", "vg0/lv1"}},
		{"rename", renameArgs("vg0", "lv1", "lv2"), []string{"lvrename", "vg0", "lv1", "lv2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !reflect.DeepEqual(tt.got, tt.want) {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestReadArgs(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		contains [][]string // each a run of adjacent arguments
	}{
		{"fullreport", fullReportArgs(), [][]string{
			{"fullreport", "--all", "--reportformat", "json", "--units", "b", "--nosuffix"},
			{"--configreport", "vg", "-o", vgFields},
			{"--configreport", "lv", "-o", lvFields},
			{"--configreport", "pv", "-o", "pv_name", "--configreport", "seg"},
		}},
		{"vgs", vgsArgs("vg0"), [][]string{{"vgs", "--reportformat", "json"}, {"-o", vgFields, "-S", `vg_name="vg0"`}}},
		{"lvs one", lvsArgs(false, "-S", `lv_name="lv1"`, "vg0"), [][]string{{"lvs", "--reportformat"}, {"-o", lvFields, "-S", `lv_name="lv1"`, "vg0"}}},
		{"lvs all", lvsArgs(true, "vg0"), [][]string{{"lvs", "--all", "--reportformat"}, {"--units", "b", "--nosuffix"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, run := range tt.contains {
				found := false
				for i := range tt.args {
					if i+len(run) <= len(tt.args) && slices.Equal(tt.args[i:i+len(run)], run) {
						found = true
					}
				}
				if !found {
					t.Errorf("%q does not hold %q", tt.args, run)
				}
			}
		})
	}
	// Every field the parser reads is asked for.
	for _, f := range []string{"vg_extent_size", "vg_free_count", "vg_missing_pv_count", "pv_count"} {
		if !strings.Contains(vgFields, f) {
			t.Errorf("vg fields lack %s", f)
		}
	}
	for _, f := range []string{"lv_attr", "lv_tags", "pool_lv", "origin", "data_percent", "metadata_percent", "lv_layout"} {
		if !strings.Contains(lvFields, f) {
			t.Errorf("lv fields lack %s", f)
		}
	}
}

func TestRoundToExtents(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		size, extent uint64
		stripes      int
		want         uint64
	}{
		{0, 4 * mib, 0, 4 * mib},
		{1, 4 * mib, 0, 4 * mib},
		{4 * mib, 4 * mib, 0, 4 * mib},
		{4*mib + 1, 4 * mib, 0, 8 * mib},
		{10 * mib, 4 * mib, 0, 12 * mib},
		{1 << 30, 4 * mib, 0, 1 << 30},
		{5 * mib, 1 * mib, 0, 5 * mib},
		{10 * mib, 32 * mib, 0, 32 * mib},
		// Striped LVs end on a stripe boundary (lvcreate: "Rounding size
		// 4.00 MiB (1 extents) up to stripe boundary size 8.00 MiB").
		{4 * mib, 4 * mib, 2, 8 * mib},
		{12 * mib, 4 * mib, 2, 16 * mib},
		{12 * mib, 4 * mib, 3, 12 * mib},
		{1, 4 * mib, 1, 4 * mib},
	}
	for _, tt := range tests {
		if got := roundToExtents(tt.size, tt.extent, tt.stripes); got != tt.want {
			t.Errorf("roundToExtents(%d, %d, %d) = %d, want %d", tt.size, tt.extent, tt.stripes, got, tt.want)
		}
	}
}

func TestExtentsNeeded(t *testing.T) {
	tests := []struct {
		n    uint64
		o    LVOptions
		want uint64
	}{
		{10, LVOptions{}, 10},
		{10, LVOptions{Stripes: 2}, 10},
		{10, LVOptions{Mirrors: 1}, 22}, // two images and two metadata extents
		{10, LVOptions{Mirrors: 2}, 33},
	}
	for _, tt := range tests {
		if got := extentsNeeded(tt.n, tt.o); got != tt.want {
			t.Errorf("extentsNeeded(%d, %+v) = %d, want %d", tt.n, tt.o, got, tt.want)
		}
	}
}
