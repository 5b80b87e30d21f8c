package lvm

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseReportThick(t *testing.T) {
	// Recorded on the host: two VGs, one of them empty, with linear and
	// striped LVs and tags.
	r, err := parseReport(readFixture(t, "fullreport-thick.json"))
	if err != nil {
		t.Fatal(err)
	}
	wantVGs := []VolumeGroup{
		{Name: "rec-empty", UUID: "Gte180-vBQD-RGiH-vqIC-wu1b-Ut7k-89io43", Size: 264241152, Free: 264241152,
			ExtentSize: 4 << 20, ExtentCount: 63, FreeExtents: 63, PVCount: 1,
			MetadataAreaSize: 1044480, MetadataAreaFree: 520704, PhysicalVolumes: []string{"/dev/loop5"}},
		{Name: "rec-thick", UUID: "cYnH2p-LzKs-3W2r-B5V7-tsXD-ZS3f-DI2OAH", Size: 1065353216, Free: 1040187392,
			ExtentSize: 4 << 20, ExtentCount: 254, FreeExtents: 248, PVCount: 2,
			MetadataAreaSize: 1044480, MetadataAreaFree: 519168, PhysicalVolumes: []string{"/dev/loop3", "/dev/loop4"}},
	}
	if !reflect.DeepEqual(r.VolumeGroups, wantVGs) {
		t.Errorf("VGs:\n got %+v\nwant %+v", r.VolumeGroups, wantVGs)
	}
	wantLVs := []LogicalVolume{
		{Name: "carve-aaaa", VolumeGroup: "rec-thick", UUID: "GvwDc2-1xIl-qj4D-pAXC-cEEU-w6Bf-Ox2Xhb", Size: 12 << 20,
			Tags: []string{"carve.dev/class=fast", "carve.dev/owner=carve", "carve.dev/volume=7076632d31"},
			Attr: Attributes{Type: TypeThick, Health: HealthOK, Raw: "-wi-XX----"},
			Path: "/dev/rec-thick/carve-aaaa", Layout: "linear", Time: recorded("2026-12-06 09:29:06 +0000")},
		{Name: "plain", VolumeGroup: "rec-thick", UUID: "8wkRGn-ZJGp-mh45-5uVe-AgK3-iN0A-vJELYG", Size: 4 << 20,
			Attr: Attributes{Type: TypeThick, Health: HealthOK, Raw: "-wi-XX----"},
			Path: "/dev/rec-thick/plain", Layout: "linear", Time: recorded("2026-12-06 09:29:07 +0000")},
		{Name: "striped", VolumeGroup: "rec-thick", UUID: "CrD8la-b06L-aZee-UeYy-gBMC-ZsRj-POgHwS", Size: 8 << 20,
			Tags: []string{"carve.dev/owner=carve"},
			Attr: Attributes{Type: TypeThick, Health: HealthOK, Raw: "-wi-XX----"},
			Path: "/dev/rec-thick/striped", Layout: "striped", Time: recorded("2026-12-06 09:29:07 +0000")},
	}
	if !reflect.DeepEqual(r.LogicalVolumes, wantLVs) {
		t.Errorf("LVs:\n got %+v\nwant %+v", r.LogicalVolumes, wantLVs)
	}
	if len(r.ThinPools) != 0 {
		t.Errorf("thin pools %+v, want none", r.ThinPools)
	}
	if vg := r.FindVG("rec-empty"); vg == nil || vg.Free != vg.Size {
		t.Errorf("FindVG(rec-empty) = %+v", vg)
	}
	if r.FindVG("nosuch") != nil || r.FindLV("rec-thick", "nosuch") != nil || r.FindLV("rec-empty", "plain") != nil {
		t.Error("Find* found what does not exist")
	}
}

func TestParseReportEmptyVG(t *testing.T) {
	r, err := parseReport(readFixture(t, "fullreport-empty.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.VolumeGroups) != 1 || r.VolumeGroups[0].Name != "rec-empty" || r.VolumeGroups[0].FreeExtents != 63 {
		t.Errorf("VGs = %+v, want the one empty VG with 63 free extents", r.VolumeGroups)
	}
	if len(r.LogicalVolumes) != 0 || len(r.ThinPools) != 0 {
		t.Errorf("an empty VG has LVs %+v, pools %+v", r.LogicalVolumes, r.ThinPools)
	}
}

func TestParseReportMissingPV(t *testing.T) {
	// Recorded on the host: a VG of two loop PVs, the second detached.
	r, err := parseReport(readFixture(t, "fullreport-missing-pv.json"))
	if err != nil {
		t.Fatal(err)
	}
	vg := r.FindVG("rec-partial")
	if vg == nil || vg.MissingPVs != 1 || vg.PVCount != 2 || vg.FreeExtents != 0 {
		t.Fatalf("VG = %+v, want 1 of 2 PVs missing and no free extents", vg)
	}
	// The missing PV is "[unknown]" in the report: no device to flush.
	if !reflect.DeepEqual(vg.PhysicalVolumes, []string{"/dev/loop3"}) {
		t.Errorf("PVs %q, want only the one still there", vg.PhysicalVolumes)
	}
	tests := []struct {
		lv     string
		health Health
	}{
		{"first", HealthOK},      // lies on the PV that is still there
		{"whole", HealthPartial}, // spans the missing one
	}
	for _, tt := range tests {
		lv := r.FindLV("rec-partial", tt.lv)
		if lv == nil || lv.Attr.Health != tt.health {
			t.Errorf("LV %s = %+v, want health %s", tt.lv, lv, tt.health)
		}
	}
}

func TestParseReportThin(t *testing.T) {
	// Recorded in the guest (activation on): a pool, two thin LVs, a thin
	// snapshot, a thick LV and the hidden pool LVs.
	r, err := parseReport(readFixture(t, "fullreport-thin.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := []ThinPool{{Name: "pool0", VolumeGroup: "rec-thin", Size: 256 << 20, DataPercent: 1.56, ZeroNewBlocks: true,
		MetadataPercent: 11.13, MetadataSize: 4 << 20, VirtualSize: 64<<20 + 64<<20 + 512<<20, ThinVolumes: 3}}
	if !reflect.DeepEqual(r.ThinPools, want) {
		t.Errorf("thin pools:\n got %+v\nwant %+v", r.ThinPools, want)
	}
	tests := []struct {
		lv, pool, origin string
		typ              VolumeType
	}{
		{"pool0", "", "", TypeThinPool},
		{"pool0_tdata", "", "", TypeInternal},
		{"pool0_tmeta", "", "", TypeInternal},
		{"lvol0_pmspare", "", "", TypeInternal},
		{"thin1", "pool0", "", TypeThin},
		{"thin2", "pool0", "", TypeThin},
		{"snap1", "pool0", "thin1", TypeThin},
		{"thick1", "", "", TypeThick},
	}
	for _, tt := range tests {
		lv := r.FindLV("rec-thin", tt.lv)
		if lv == nil {
			t.Errorf("LV %s missing (hidden LVs are reported without brackets)", tt.lv)
			continue
		}
		if lv.Attr.Type != tt.typ || lv.Pool != tt.pool || lv.Origin != tt.origin {
			t.Errorf("LV %s: type %s pool %q origin %q, want %s %q %q", tt.lv, lv.Attr.Type, lv.Pool, lv.Origin, tt.typ, tt.pool, tt.origin)
		}
	}
}

func TestParseLVsAndVGs(t *testing.T) {
	tests := []struct {
		fixture string
		lvs     []string // names, in order
		vgs     []string
	}{
		{"lvs-get.json", []string{"carve-aaaa"}, nil},
		{"lvs-get-none.json", nil, nil},
		{"lvs-list.json", []string{"carve-aaaa", "plain", "striped"}, nil},
		{"lvs-tag.json", []string{"carve-aaaa", "striped"}, nil},
		{"lvs-thin-list.json", []string{"lvol0_pmspare", "pool0", "pool0_tdata", "pool0_tmeta", "snap1", "thick1", "thin1", "thin2"}, nil},
		{"vgs.json", nil, []string{"rec-thick"}},
		{"vgs-none.json", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			r, err := parseReport(readFixture(t, tt.fixture))
			if err != nil {
				t.Fatal(err)
			}
			var lvs, vgs []string
			for _, lv := range r.LogicalVolumes {
				lvs = append(lvs, lv.Name)
			}
			for _, vg := range r.VolumeGroups {
				vgs = append(vgs, vg.Name)
			}
			if !reflect.DeepEqual(lvs, tt.lvs) || !reflect.DeepEqual(vgs, tt.vgs) {
				t.Errorf("LVs %v VGs %v, want %v %v", lvs, vgs, tt.lvs, tt.vgs)
			}
		})
	}
}

func TestParseReportErrors(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"not JSON", `WARNING: something`, "decoding lvm JSON report"},
		{"truncated", `{"report": [{"vg": [`, "decoding lvm JSON report"},
		{"size with suffix", `{"report":[{"vg":[{"vg_name":"v","vg_size":"1.00g"}]}]}`, `vg_size: "1.00g" is not a number`},
		{"negative free", `{"report":[{"vg":[{"vg_name":"v","vg_free":"-1"}]}]}`, "vg_free"},
		{"lv size", `{"report":[{"lv":[{"vg_name":"v","lv_name":"l","lv_size":"12m"}]}]}`, "v/l: field lv_size"},
		{"pool percent", `{"report":[{"lv":[{"vg_name":"v","lv_name":"p","lv_attr":"twi-a-tz--","data_percent":"x"}]}]}`, "thin pool v/p: field data_percent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseReport([]byte(tt.json))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestLVTimeAndSnapPercent(t *testing.T) {
	out := []byte(`{"report":[{"lv":[
	{"vg_name":"vg0","lv_name":"s1","lv_size":"8388608","lv_attr":"swi-a-s---","origin":"lv1","data_percent":"12.50","lv_time":"2026-11-23 16:04:05 +0000"},
	{"vg_name":"vg0","lv_name":"lv1","lv_size":"8388608","lv_attr":"owi-a-----","data_percent":"","lv_time":"not a time"}]}]}`)
	lvs, err := parseLVs(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 11, 23, 16, 4, 5, 0, time.UTC); !lvs[0].Time.Equal(want) || lvs[0].SnapPercent != 12.5 {
		t.Errorf("snapshot: time %v, snap percent %v; want %v, 12.5", lvs[0].Time, lvs[0].SnapPercent, want)
	}
	if !lvs[1].Time.IsZero() || lvs[1].SnapPercent != 0 {
		t.Errorf("origin: time %v, snap percent %v; want zero", lvs[1].Time, lvs[1].SnapPercent)
	}
}

// recorded is an lv_time of a recording.
func recorded(s string) time.Time {
	t, err := time.Parse(lvTimeLayout, s)
	if err != nil {
		panic(err)
	}
	return t
}
