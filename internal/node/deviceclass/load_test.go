package deviceclass

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/node/lvm"
)

const goodFile = `
deviceClasses:
  - name: fast
    volumeGroup: vg-fast
    default: true
    spare: 1Gi
  - name: fast-thin
    volumeGroup: vg-fast
    thinPool: pool0
    overprovisionRatio: 4
    spare: 512Mi
  - name: striped
    volumeGroup: vg-slow
    lvcreateOptions:
      stripes: 2
      stripeSize: 65536
`

func TestParseGood(t *testing.T) {
	cfg, err := Parse([]byte(goodFile))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got := cfg.Names(); strings.Join(got, ",") != "fast,fast-thin,striped" {
		t.Errorf("names = %v", got)
	}
	def, ok := cfg.Class("")
	if !ok || def.Name != "fast" {
		t.Fatalf("default class = %v, %v; want fast", def, ok)
	}
	if def.SpareBytes() != 1<<30 || def.Thin() || def.Ratio() != 1 {
		t.Errorf("fast: spare %d thin %v ratio %v", def.SpareBytes(), def.Thin(), def.Ratio())
	}
	thin, ok := cfg.Class("fast-thin")
	if !ok || !thin.Thin() || thin.Ratio() != 4 || thin.SpareBytes() != 512<<20 {
		t.Errorf("fast-thin = %+v", thin)
	}
	st, _ := cfg.Class("striped")
	if st.LVCreateOptions != (lvm.LVOptions{Stripes: 2, StripeSize: 65536}) || st.SpareBytes() != 0 {
		t.Errorf("striped = %+v", st)
	}
	if _, ok := cfg.Class("nope"); ok {
		t.Error("Class(nope) found a class")
	}
}

func TestParseRefusesBadFile(t *testing.T) {
	tests := []struct {
		name string
		file string
		want []string // substrings of the error
	}{
		{"unknown top-level key", "deviceClass:\n  - name: a\n", []string{`unknown field "deviceClass"`}},
		{"unknown class key", "deviceClasses:\n  - name: a\n    volumeGroup: vg\n    thinpool: p\n", []string{`unknown field "deviceClasses[0].thinpool"`}},
		{"unknown option key", "deviceClasses:\n  - name: a\n    volumeGroup: vg\n    lvcreateOptions: {raid: 5}\n", []string{`unknown field`, `raid`}},
		{"empty", "deviceClasses: []\n", []string{"at least one device class"}},
		{"two defaults", "deviceClasses:\n  - {name: a, volumeGroup: vg, default: true}\n  - {name: b, volumeGroup: vg, default: true}\n", []string{"at most one class may be the default", `"a" "b"`}},
		{"duplicate names", "deviceClasses:\n  - {name: a, volumeGroup: vg}\n  - {name: a, volumeGroup: vg2}\n", []string{`deviceClasses[1] (a): name "a" is used by more than one device class`}},
		{"missing name", "deviceClasses:\n  - {volumeGroup: vg}\n", []string{"deviceClasses[0]: name: must be set"}},
		{"bad name", "deviceClasses:\n  - {name: Fast_1, volumeGroup: vg}\n", []string{`name "Fast_1": must be a DNS-1123 label`}},
		{"missing vg", "deviceClasses:\n  - {name: a}\n", []string{"volumeGroup: must be set"}},
		{"bad vg", "deviceClasses:\n  - {name: a, volumeGroup: -vg}\n", []string{`deviceClasses[0] (a): volumeGroup: `, `"-vg" begins with '-'`}},
		{"vg with slash", "deviceClasses:\n  - {name: a, volumeGroup: vg/x}\n", []string{`deviceClasses[0] (a): volumeGroup: `, `"vg/x" holds '/'`}},
		{"bad quantity", "deviceClasses:\n  - {name: a, volumeGroup: vg, spare: 1Gx}\n", []string{"quantities must match"}},
		{"negative spare", "deviceClasses:\n  - {name: a, volumeGroup: vg, spare: -1Gi}\n", []string{"spare -1Gi: must not be negative"}},
		{"ratio below 1", "deviceClasses:\n  - {name: a, volumeGroup: vg, thinPool: p, overprovisionRatio: 0.5}\n", []string{"overprovisionRatio 0.5: must be at least 1"}},
		{"ratio on thick", "deviceClasses:\n  - {name: a, volumeGroup: vg, overprovisionRatio: 2}\n", []string{"only thin classes"}},
		{"snapshot space on thin", "deviceClasses:\n  - {name: a, volumeGroup: vg, thinPool: p, snapshotSpacePercent: 20}\n", []string{"snapshotSpacePercent: only thick classes"}},
		{"snapshot space above 100", "deviceClasses:\n  - {name: a, volumeGroup: vg, snapshotSpacePercent: 101}\n", []string{"snapshotSpacePercent 101: must be 1-100"}},
		{"snapshot space negative", "deviceClasses:\n  - {name: a, volumeGroup: vg, snapshotSpacePercent: -1}\n", []string{"snapshotSpacePercent -1: must be 1-100"}},
		{"options on thin", "deviceClasses:\n  - {name: a, volumeGroup: vg, thinPool: p, lvcreateOptions: {stripes: 2}}\n", []string{"only thick classes"}},
		{"bad thin pool name", "deviceClasses:\n  - {name: a, volumeGroup: vg, thinPool: '-p'}\n", []string{`deviceClasses[0] (a): thinPool: `, `"-p" begins with '-'`}},
		{"stripe size without stripes", "deviceClasses:\n  - {name: a, volumeGroup: vg, lvcreateOptions: {stripeSize: 65536}}\n", []string{"deviceClasses[0] (a): lvcreateOptions: ", "stripeSize needs stripes of 2 or more"}},
		{"stripe size not power of two", "deviceClasses:\n  - {name: a, volumeGroup: vg, lvcreateOptions: {stripes: 2, stripeSize: 65535}}\n", []string{"must be a power of two"}},
		{"negative mirrors", "deviceClasses:\n  - {name: a, volumeGroup: vg, lvcreateOptions: {mirrors: -1}}\n", []string{"deviceClasses[0] (a): lvcreateOptions: ", "mirrors is -1"}},
		{"mirrors and stripes", "deviceClasses:\n  - {name: a, volumeGroup: vg, lvcreateOptions: {mirrors: 1, stripes: 2}}\n", []string{"deviceClasses[0] (a): lvcreateOptions: ", "stripes and mirrors cannot be combined"}},
		// What every CreateVolume of the class would refuse (the lvm
		// package's rules) does not load either.
		{"vg name too long", "deviceClasses:\n  - {name: a, volumeGroup: " + strings.Repeat("v", 128) + "}\n", []string{"deviceClasses[0] (a): volumeGroup: ", "128 bytes long, at most 127"}},
		{"vg name dot-dot", "deviceClasses:\n  - {name: a, volumeGroup: '..'}\n", []string{"deviceClasses[0] (a): volumeGroup: ", `".." is reserved`}},
		{"thin pool name reserved by LVM", "deviceClasses:\n  - {name: a, volumeGroup: vg, thinPool: pool_tmeta}\n", []string{"deviceClasses[0] (a): thinPool: ", `holding "_tmeta" are reserved`}},
		{"thin pool name of a snapshot", "deviceClasses:\n  - {name: a, volumeGroup: vg, thinPool: snapshot0}\n", []string{"deviceClasses[0] (a): thinPool: ", `beginning with "snapshot"`}},
		{"thin pool name too long", "deviceClasses:\n  - {name: a, volumeGroup: vg, thinPool: " + strings.Repeat("p", 128) + "}\n", []string{"deviceClasses[0] (a): thinPool: ", "at most 127"}},
		{"more stripes than LVM allows", "deviceClasses:\n  - {name: wide, volumeGroup: vg, lvcreateOptions: {stripes: 129}}\n", []string{"deviceClasses[0] (wide): lvcreateOptions: ", "stripes is 129, allowed are 0 to 128"}},
		{"negative stripes", "deviceClasses:\n  - {name: a, volumeGroup: vg, lvcreateOptions: {stripes: -2}}\n", []string{"deviceClasses[0] (a): lvcreateOptions: ", "stripes is -2"}},
		{"more mirrors than LVM allows", "deviceClasses:\n  - {name: safe, volumeGroup: vg, lvcreateOptions: {mirrors: 10}}\n", []string{"deviceClasses[0] (safe): lvcreateOptions: ", "mirrors is 10, allowed are 0 to 9"}},
		{"stripe size below a page", "deviceClasses:\n  - {name: a, volumeGroup: vg, lvcreateOptions: {stripes: 2, stripeSize: 2048}}\n", []string{"deviceClasses[0] (a): lvcreateOptions: ", "stripeSize is 2048", "at least 4096"}},
		{"stripe size with one stripe", "deviceClasses:\n  - {name: a, volumeGroup: vg, lvcreateOptions: {stripes: 1, stripeSize: 65536}}\n", []string{"deviceClasses[0] (a): lvcreateOptions: ", "stripes of 2 or more"}},
		{"second class named in the message", "deviceClasses:\n  - {name: a, volumeGroup: vg}\n  - {name: b, volumeGroup: vg, lvcreateOptions: {mirrors: 12}}\n", []string{"deviceClasses[1] (b): lvcreateOptions: ", "mirrors is 12"}},
		{"mkfs option outside the allow-list", "deviceClasses:\n  - {name: a, volumeGroup: vg, mkfsOptions: {xfs: ['-l', 'logdev=/dev/sdb']}}\n", []string{`deviceClasses[0] (a): mkfsOptions.xfs[1] "logdev=/dev/sdb" (value of -l): option "logdev": allowed: size, version`}},
		{"mkfs flag and value in one item", "deviceClasses:\n  - {name: a, volumeGroup: vg, mkfsOptions: {ext4: ['-O ^orphan_file']}}\n", []string{`deviceClasses[0] (a): mkfsOptions.ext4[0] "-O ^orphan_file": not an allowed flag of mkfs.ext4`, "separate items"}},
		{"mkfs options of an unknown filesystem", "deviceClasses:\n  - {name: a, volumeGroup: vg, mkfsOptions: {zfs: []}}\n", []string{"deviceClasses[0] (a): mkfsOptions.zfs: not a filesystem carve makes; allowed: ext4, xfs, btrfs"}},
		{"spare beyond any size", "deviceClasses:\n  - {name: a, volumeGroup: vg, spare: 1e30}\n", []string{"deviceClasses[0] (a): spare 1e+30: at most 4611686018427387904 bytes"}},
		{"spare just beyond the largest size", "deviceClasses:\n  - {name: a, volumeGroup: vg, spare: 4611686018427387905}\n", []string{"deviceClasses[0] (a): spare 4611686018427387905: at most"}},
		{"not yaml", "deviceClasses: [\n", []string{"decode"}},
		{"unknown erase method", "deviceClasses:\n  - {name: a, volumeGroup: vg, erase: discard}\n", []string{`deviceClasses[0] (a): erase "discard": must be one of [zeroout write none]`}},
		{"erase on thin", "deviceClasses:\n  - {name: a, volumeGroup: vg, thinPool: p, erase: write}\n", []string{"deviceClasses[0] (a): erase: only thick classes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.file))
			if err == nil {
				t.Fatal("Parse accepted the file")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(goodFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(good); err != nil {
		t.Errorf("Load(good): %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "read device-class file") {
		t.Errorf("Load(missing) = %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("deviceClasses: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("Load(bad) = %v; want an error naming the file", err)
	}
}

func TestVolumeGroups(t *testing.T) {
	c := &Config{DeviceClasses: []DeviceClass{{Name: "a", VolumeGroup: "vg2"}, {Name: "b", VolumeGroup: "vg1"}, {Name: "c", VolumeGroup: "vg2"}}}
	if got := c.VolumeGroups(); !slices.Equal(got, []string{"vg2", "vg1"}) {
		t.Errorf("VolumeGroups = %v, want [vg2 vg1]: each once, in file order", got)
	}
	if !c.HasVolumeGroup("vg1") || c.HasVolumeGroup("vg3") {
		t.Error("HasVolumeGroup is wrong")
	}
}

func TestEraseMethodDefaultsToZeroOutForThickClasses(t *testing.T) {
	c, err := Parse([]byte("deviceClasses:\n  - {name: a, volumeGroup: vg}\n  - {name: b, volumeGroup: vg, erase: write}\n" +
		"  - {name: c, volumeGroup: vg, erase: none}\n  - {name: t, volumeGroup: vg, thinPool: p}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]erase.Method{"a": erase.ZeroOut, "b": erase.Write, "c": erase.None, "t": erase.None} {
		d, _ := c.Class(name)
		if got := d.EraseMethod(); got != want {
			t.Errorf("class %s: EraseMethod() = %q, want %q", name, got, want)
		}
	}
}

func TestSnapshotCowSize(t *testing.T) {
	tests := []struct {
		percent    int
		size, want uint64
	}{
		{0, 10 << 30, 2<<30 + 16<<20}, // 20 %, plus 1/128 for the store's metadata
		{20, 100, 21},
		{20, 101, 22}, // 20.2 rounded up, plus 1
		{100, 1 << 30, 1<<30 + 8<<20},
		{1, 1 << 62, 46116860184273880 + 360287970189640},        // 2^62 / 100 and 1/128 of it, rounded up
		{50, 1<<63 - 1, 4611686018427387904 + 36028797018963968}, // no overflow
	}
	for _, tt := range tests {
		d := DeviceClass{SnapshotSpacePercent: tt.percent}
		if got := d.SnapshotCowSize(tt.size); got != tt.want {
			t.Errorf("SnapshotSpacePercent %d: SnapshotCowSize(%d) = %d, want %d", tt.percent, tt.size, got, tt.want)
		}
	}
}

// A class's mkfsOptions replace the default of the filesystems it lists
// (an empty list: the tool's own defaults); the others keep the default,
// which keeps filesystems mountable on fs.OldestKernel.
func TestMkfsOptionsPerClass(t *testing.T) {
	cfg, err := Parse([]byte(`
deviceClasses:
  - name: a
    volumeGroup: vg
    mkfsOptions:
      xfs: ["-m", "reflink=0"]
      btrfs: []
`))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := cfg.Class("a")
	cases := []struct {
		fsType string
		want   []string
	}{
		{"xfs", []string{"-m", "reflink=0"}},
		{"btrfs", []string{}},
		{"ext4", fs.DefaultMkfsOptions("ext4")},
	}
	for _, tc := range cases {
		if got := c.MkfsArgs(tc.fsType); !slices.Equal(got, tc.want) {
			t.Errorf("MkfsArgs(%s) = %q, want %q", tc.fsType, got, tc.want)
		}
	}
	if d := fs.DefaultMkfsOptions("xfs"); !slices.Contains(d, "bigtime=0,inobtcount=0") || !slices.Contains(d, "nrext64=0") {
		t.Errorf("default xfs options %q do not turn off the features kernels before 5.10/5.19 cannot mount", d)
	}
}
