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

// State is read only from LVM's JSON reports, in bytes without unit
// suffixes, so nothing depends on the locale or on column layout. LVM prints
// every value as a JSON string.
var reportFlags = []string{"--reportformat", "json", "--units", "b", "--nosuffix"}

// The fields carve reads. Selection strings quote names, which validation
// keeps free of quotes.
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

// fullReportArgs is the one command that reads everything: `lvm fullreport`
// has a sub-report per object kind and, unlike `vgs -o +lv_name`, keeps the
// volume groups that have no LV. The pv sub-report names each volume
// group's PVs (what a flush of its metadata goes to); the segment and
// pv-segment sub-reports cannot be switched off, so each gets one field
// and a selection that matches nothing. vgs limits it to those volume
// groups (validated names); none means all.
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

// vgsArgs reads one volume group; a missing one is an empty report, not a
// failure, because it is a selection rather than a name.
func vgsArgs(vg string) []string {
	args := append([]string{"vgs"}, reportFlags...)
	return append(args, "-o", vgFields, "-S", fmt.Sprintf("vg_name=%q", vg))
}

// lvsArgs reads LVs: lvsArgs(false, "-S", sel, vg), lvsArgs(true, vg), ...
// all adds hidden (internal) LVs.
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

// numbers collects the first conversion error of a row, so that one error
// check covers all fields.
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
	// ParseFloat takes "NaN" and "Inf"; a NaN percentage would make every
	// comparison of a pool's use false.
	if (err != nil || math.IsNaN(v) || math.IsInf(v, 0)) && n.err == nil {
		n.err = fmt.Errorf("field %s: %q is not a number", field, s)
		v = 0
	}
	return v
}

// splitTags splits LVM's comma-separated tag list (tags cannot hold commas).
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
	// With --all, hidden LVs are printed in brackets: [pool_tdata].
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
	// A time LVM prints otherwise (another time_format in lvm.conf) is
	// left unknown rather than failing the report.
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

// parseReport turns the JSON of fullreport (or of vgs/lvs, which have the
// same shape with fewer sub-reports) into a Report. Thin pools are derived
// from the LVs: their usage from the pool's own row, their virtual size and
// count from the thin LVs that name them.
func parseReport(stdout []byte) (*Report, error) {
	raw, err := decodeReport(stdout)
	if err != nil {
		return nil, err
	}
	r := &Report{}
	var pools []jsonLV
	var poolLVs []LogicalVolume
	for _, sub := range raw.Report {
		// fullreport has one sub-report per volume group: its PVs are
		// those of the sub-report's volume group.
		var pvs []string
		for _, j := range sub.PV {
			// A missing PV is "[unknown]": there is no device to reach.
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
			// The LV's name, brackets of a hidden LV taken off, so that
			// FindLV and FindThinPool agree.
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
