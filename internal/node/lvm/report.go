package lvm

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// JSON reports in bytes without suffixes: independent of locale and layout.
var reportFlags = []string{"--reportformat", "json", "--units", "b", "--nosuffix"}

// The fields carve reads. Selections quote names; validation keeps quotes out.
var (
	vgFields = strings.Join([]string{
		"vg_name", "vg_uuid", "vg_size", "vg_free", "vg_extent_size", "vg_extent_count",
		"vg_free_count", "vg_missing_pv_count", "pv_count", "vg_tags", "vg_mda_size", "vg_mda_free",
	}, ",")
	lvFields = strings.Join([]string{
		"vg_name", "lv_name", "lv_uuid", "lv_size", "lv_attr", "lv_layout", "lv_tags",
		"pool_lv", "origin", "lv_path", "data_percent", "metadata_percent", "lv_metadata_size",
		"lv_time",
	}, ",")
)

// fullReportArgs reads everything in one command: unlike `vgs -o +lv_name`,
// fullreport keeps VGs without LVs, and its pv sub-report names the PVs a
// metadata flush goes to. The segment sub-reports cannot be switched off, so
// each gets one field and a selection that matches nothing.
func fullReportArgs(vgs ...string) []string {
	args := []string{"fullreport", "--all"}
	args = append(args, reportFlags...)
	args = append(args,
		"--configreport", "vg", "-o", vgFields,
		"--configreport", "lv", "-o", lvFields,
		"--configreport", "pv", "-o", "pv_name",
		"--configreport", "seg", "-o", "segtype", "-S", "seg_size<0",
		"--configreport", "pvseg", "-o", "pvseg_start", "-S", "pvseg_size<0",
	)
	return append(args, vgs...)
}

// vgsArgs reads one VG; a selection makes a missing one an empty report.
func vgsArgs(vg string) []string {
	args := append([]string{"vgs"}, reportFlags...)
	return append(args, "-o", vgFields, "-S", fmt.Sprintf("vg_name=%q", vg))
}

func lvsArgs(all bool, rest ...string) []string {
	args := []string{"lvs"}
	if all {
		args = append(args, "--all")
	}
	args = append(args, reportFlags...)
	args = append(args, "-o", lvFields)
	return append(args, rest...)
}

type jsonReport struct {
	Report []struct {
		VG []jsonVG `json:"vg"`
		PV []jsonPV `json:"pv"`
		LV []jsonLV `json:"lv"`
	} `json:"report"`
}

type jsonPV struct {
	Name string `json:"pv_name"`
}

type jsonVG struct {
	Name        string `json:"vg_name"`
	UUID        string `json:"vg_uuid"`
	Size        string `json:"vg_size"`
	Free        string `json:"vg_free"`
	ExtentSize  string `json:"vg_extent_size"`
	ExtentCount string `json:"vg_extent_count"`
	FreeCount   string `json:"vg_free_count"`
	MissingPVs  string `json:"vg_missing_pv_count"`
	PVCount     string `json:"pv_count"`
	Tags        string `json:"vg_tags"`
	MDASize     string `json:"vg_mda_size"`
	MDAFree     string `json:"vg_mda_free"`
}

type jsonLV struct {
	VG              string `json:"vg_name"`
	Name            string `json:"lv_name"`
	UUID            string `json:"lv_uuid"`
	Size            string `json:"lv_size"`
	Attr            string `json:"lv_attr"`
	Layout          string `json:"lv_layout"`
	Tags            string `json:"lv_tags"`
	Pool            string `json:"pool_lv"`
	Origin          string `json:"origin"`
	Path            string `json:"lv_path"`
	DataPercent     string `json:"data_percent"`
	MetadataPercent string `json:"metadata_percent"`
	MetadataSize    string `json:"lv_metadata_size"`
	Time            string `json:"lv_time"`
}

// lvTimeLayout is how LVM prints lv_time under LC_ALL=C.
const lvTimeLayout = "2006-01-02 15:04:05 -0700"

// numbers keeps a row's first conversion error, so one check covers all.
type numbers struct{ err error }

func (n *numbers) uint(field, s string) uint64 {
	if s == "" {
		return 0
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil && n.err == nil {
		n.err = fmt.Errorf("field %s: %q is not a number", field, s)
	}
	return v
}

func (n *numbers) int(field, s string) int {
	return int(n.uint(field, s))
}

func (n *numbers) float(field, s string) float64 {
	if s == "" {
		return 0
	}
	v, err := strconv.ParseFloat(s, 64)
	// A NaN percentage would make every comparison of a pool's use false.
	if (err != nil || math.IsNaN(v) || math.IsInf(v, 0)) && n.err == nil {
		n.err = fmt.Errorf("field %s: %q is not a number", field, s)
		v = 0
	}
	return v
}

func splitTags(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func (j jsonVG) volumeGroup() (VolumeGroup, error) {
	var n numbers
	vg := VolumeGroup{
		Name:        j.Name,
		UUID:        j.UUID,
		Size:        n.uint("vg_size", j.Size),
		Free:        n.uint("vg_free", j.Free),
		ExtentSize:  n.uint("vg_extent_size", j.ExtentSize),
		ExtentCount: n.uint("vg_extent_count", j.ExtentCount),
		FreeExtents: n.uint("vg_free_count", j.FreeCount),
		MissingPVs:  n.int("vg_missing_pv_count", j.MissingPVs),
		PVCount:     n.int("pv_count", j.PVCount),
		Tags:        splitTags(j.Tags),

		MetadataAreaSize: n.uint("vg_mda_size", j.MDASize),
		MetadataAreaFree: n.uint("vg_mda_free", j.MDAFree),
	}
	if n.err != nil {
		return vg, fmt.Errorf("volume group %s: %w", j.Name, n.err)
	}
	return vg, nil
}

func (j jsonLV) logicalVolume() (LogicalVolume, error) {
	var n numbers
	attr := ParseAttributes(j.Attr)
	name := j.Name
	if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
		name = name[1 : len(name)-1]
		if attr.Type == TypeThick || attr.Type == TypeOther {
			attr.Type = TypeInternal
		}
	}
	lv := LogicalVolume{
		Name:        name,
		VolumeGroup: j.VG,
		UUID:        j.UUID,
		Size:        n.uint("lv_size", j.Size),
		Tags:        splitTags(j.Tags),
		Attr:        attr,
		Pool:        strings.Trim(j.Pool, "[]"),
		Origin:      strings.Trim(j.Origin, "[]"),
		Path:        j.Path,
		Layout:      j.Layout,
	}
	if attr.Type == TypeSnapshot {
		lv.SnapPercent = n.float("data_percent", j.DataPercent)
	}
	// Another time_format in lvm.conf leaves the time unknown, not a failure.
	if t, err := time.Parse(lvTimeLayout, j.Time); err == nil {
		lv.Time = t
	}
	if n.err != nil {
		return lv, fmt.Errorf("logical volume %s/%s: %w", j.VG, j.Name, n.err)
	}
	return lv, nil
}

func decodeReport(stdout []byte) (*jsonReport, error) {
	var r jsonReport
	if err := json.Unmarshal(stdout, &r); err != nil {
		return nil, fmt.Errorf("decoding lvm JSON report: %w", err)
	}
	return &r, nil
}

// parseReport turns fullreport's JSON into a Report; thin pools' virtual
// size and count come from their thin LVs.
func parseReport(stdout []byte) (*Report, error) {
	raw, err := decodeReport(stdout)
	if err != nil {
		return nil, err
	}
	r := &Report{}
	var pools []jsonLV
	var poolLVs []LogicalVolume
	for _, sub := range raw.Report {
		var pvs []string
		for _, j := range sub.PV {
			if strings.HasPrefix(j.Name, "/") {
				pvs = append(pvs, j.Name)
			}
		}
		for _, j := range sub.VG {
			vg, err := j.volumeGroup()
			if err != nil {
				return nil, err
			}
			vg.PhysicalVolumes = pvs
			r.VolumeGroups = append(r.VolumeGroups, vg)
		}
		for _, j := range sub.LV {
			lv, err := j.logicalVolume()
			if err != nil {
				return nil, err
			}
			r.LogicalVolumes = append(r.LogicalVolumes, lv)
			if lv.Attr.Type == TypeThinPool {
				pools = append(pools, j)
				poolLVs = append(poolLVs, lv)
			}
		}
	}
	for i, j := range pools {
		var n numbers
		p := ThinPool{
			// Without the brackets of a hidden LV, so FindLV and FindThinPool agree.
			Name:            poolLVs[i].Name,
			VolumeGroup:     j.VG,
			Size:            n.uint("lv_size", j.Size),
			DataPercent:     n.float("data_percent", j.DataPercent),
			MetadataPercent: n.float("metadata_percent", j.MetadataPercent),
			MetadataSize:    n.uint("lv_metadata_size", j.MetadataSize),
			ZeroNewBlocks:   poolLVs[i].Attr.ZeroNewBlocks,
		}
		if n.err != nil {
			return nil, fmt.Errorf("thin pool %s/%s: %w", j.VG, j.Name, n.err)
		}
		for _, lv := range r.LogicalVolumes {
			if lv.Attr.Type == TypeThin && lv.VolumeGroup == p.VolumeGroup && lv.Pool == p.Name {
				p.VirtualSize += lv.Size
				p.ThinVolumes++
			}
		}
		r.ThinPools = append(r.ThinPools, p)
	}
	return r, nil
}

func parseLVs(stdout []byte) ([]LogicalVolume, error) {
	r, err := parseReport(stdout)
	if err != nil {
		return nil, err
	}
	return r.LogicalVolumes, nil
}

// FindVG returns the named volume group of the report, or nil.
func (r *Report) FindVG(name string) *VolumeGroup {
	i := slices.IndexFunc(r.VolumeGroups, func(vg VolumeGroup) bool { return vg.Name == name })
	if i < 0 {
		return nil
	}
	return &r.VolumeGroups[i]
}

// FindLV returns the LV vg/name of the report, or nil.
func (r *Report) FindLV(vg, name string) *LogicalVolume {
	i := slices.IndexFunc(r.LogicalVolumes, func(lv LogicalVolume) bool {
		return lv.VolumeGroup == vg && lv.Name == name
	})
	if i < 0 {
		return nil
	}
	return &r.LogicalVolumes[i]
}

// FindThinPool returns the thin pool vg/name of the report, or nil.
func (r *Report) FindThinPool(vg, name string) *ThinPool {
	i := slices.IndexFunc(r.ThinPools, func(p ThinPool) bool { return p.VolumeGroup == vg && p.Name == name })
	if i < 0 {
		return nil
	}
	return &r.ThinPools[i]
}
