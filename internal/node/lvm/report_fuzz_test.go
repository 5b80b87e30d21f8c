package lvm

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseReport feeds parseReport the reports recorded from real lvm2
// (testdata/*.json, the command recordings of failures-*.json excepted) and
// what the fuzzer makes of them. Beyond not panicking, an accepted report
// must be internally consistent and survive a canonical re-encoding of its
// numbers unchanged.
func FuzzParseReport(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		if strings.HasPrefix(filepath.Base(name), "failures-") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"report":[{"lv":[{"vg_name":"vg","lv_name":"[p]","lv_attr":"twi-a-tz--","lv_size":"8"},` +
		`{"vg_name":"vg","lv_name":"t","lv_attr":"Vwi-a-tz--","pool_lv":"[p]","lv_size":"4"}]}]}`))
	f.Add([]byte(`{"report":[{"lv":[{"vg_name":"vg","lv_name":"p","lv_attr":"twi-a-tz--","data_percent":"NaN"}]}]}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := parseReport(data)
		if err != nil {
			return
		}
		again, err := parseReport(data)
		if err != nil || !reflect.DeepEqual(r, again) {
			t.Fatalf("a second parse differs: %v", err)
		}
		checkReportConsistent(t, r)

		// The numbers, written back as LVM writes them, give the same report.
		raw, err := decodeReport(data)
		if err != nil {
			t.Fatalf("parseReport accepted what decodeReport refuses: %v", err)
		}
		vgs, lvs, pools := 0, 0, 0
		for i := range raw.Report {
			for k := range raw.Report[i].VG {
				canonicalVG(&raw.Report[i].VG[k], r.VolumeGroups[vgs])
				vgs++
			}
			for k := range raw.Report[i].LV {
				lv := r.LogicalVolumes[lvs]
				canonicalLV(&raw.Report[i].LV[k], lv)
				if lv.Attr.Type == TypeThinPool {
					canonicalPool(&raw.Report[i].LV[k], r.ThinPools[pools])
					pools++
				}
				lvs++
			}
		}
		b, err := json.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		round, err := parseReport(b)
		if err != nil {
			t.Fatalf("the report written back does not parse: %v\n%s", err, b)
		}
		if !reflect.DeepEqual(r, round) {
			t.Fatalf("round trip differs:\n got %+v\nwant %+v", round, r)
		}
	})
}

// checkReportConsistent asserts what callers of a Report rely on.
func checkReportConsistent(t *testing.T, r *Report) {
	t.Helper()
	for _, lv := range r.LogicalVolumes {
		if lv.Attr.Type == TypeInternal && strings.HasPrefix(lv.Name, "[") && strings.HasSuffix(lv.Name, "]") && len(lv.Name) > 1 {
			t.Errorf("hidden LV %q kept its brackets", lv.Name)
		}
	}
	for _, p := range r.ThinPools {
		// Any of the LVs of its name (LVM reports one; the fuzzer, more).
		if !slices.ContainsFunc(r.LogicalVolumes, func(lv LogicalVolume) bool {
			return lv.VolumeGroup == p.VolumeGroup && lv.Name == p.Name && lv.Attr.Type == TypeThinPool
		}) {
			t.Errorf("thin pool %s/%s is not an LV of the report of type thin pool", p.VolumeGroup, p.Name)
		}
		if math.IsNaN(p.DataPercent) || math.IsInf(p.DataPercent, 0) || math.IsNaN(p.MetadataPercent) || math.IsInf(p.MetadataPercent, 0) {
			t.Errorf("thin pool %s/%s: percentages %v, %v are not finite", p.VolumeGroup, p.Name, p.DataPercent, p.MetadataPercent)
		}
		var n int
		var virtual uint64
		for _, lv := range r.LogicalVolumes {
			if lv.Attr.Type == TypeThin && lv.VolumeGroup == p.VolumeGroup && lv.Pool == p.Name {
				n++
				virtual += lv.Size
			}
		}
		// Two pools of one name in one VG count the same thin LVs twice;
		// each still counts exactly the LVs that name it.
		if p.ThinVolumes != n || p.VirtualSize != virtual {
			t.Errorf("thin pool %s/%s: %d volumes of %d bytes, its LVs are %d of %d", p.VolumeGroup, p.Name, p.ThinVolumes, p.VirtualSize, n, virtual)
		}
	}
}

func formatUint(v uint64, was string) string {
	if was == "" && v == 0 {
		return ""
	}
	return strconv.FormatUint(v, 10)
}

func canonicalVG(j *jsonVG, vg VolumeGroup) {
	j.Size = formatUint(vg.Size, j.Size)
	j.Free = formatUint(vg.Free, j.Free)
	j.ExtentSize = formatUint(vg.ExtentSize, j.ExtentSize)
	j.ExtentCount = formatUint(vg.ExtentCount, j.ExtentCount)
	j.FreeCount = formatUint(vg.FreeExtents, j.FreeCount)
	j.MissingPVs = formatUint(uint64(vg.MissingPVs), j.MissingPVs)
	j.PVCount = formatUint(uint64(vg.PVCount), j.PVCount)
	j.Tags = strings.Join(vg.Tags, ",")
}

func canonicalLV(j *jsonLV, lv LogicalVolume) {
	j.Size = formatUint(lv.Size, j.Size)
	j.Tags = strings.Join(lv.Tags, ",")
}

// canonicalPool writes the pool's own numbers (thin pools follow their LVs
// in order, one per thin-pool LV).
func canonicalPool(j *jsonLV, p ThinPool) {
	if j.DataPercent != "" {
		j.DataPercent = strconv.FormatFloat(p.DataPercent, 'g', -1, 64)
	}
	if j.MetadataPercent != "" {
		j.MetadataPercent = strconv.FormatFloat(p.MetadataPercent, 'g', -1, 64)
	}
	j.MetadataSize = formatUint(p.MetadataSize, j.MetadataSize)
}
