package deviceclass

import (
	"math"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/internal/node/lvm"
)

// FuzzParse checks what an accepted device-class file promises the rest of
// carve: every class makes CreateRequests the lvm package accepts (a file
// that every CreateVolume would refuse does not load), names are unique
// DNS-1123 labels, at most one default, a usable ratio, and the file written
// back as YAML loads as the same classes.
func FuzzParse(f *testing.F) {
	f.Add([]byte(goodFile))
	// The file of deploy/kubernetes/device-classes.yaml.
	f.Add([]byte("deviceClasses:\n  - {name: thick, volumeGroup: carve, default: true, spare: 1Gi}\n" +
		"  - {name: thin, volumeGroup: carve, thinPool: pool0, overprovisionRatio: 4, spare: 1Gi}\n"))
	f.Add([]byte("deviceClasses:\n  - {name: m, volumeGroup: vg, lvcreateOptions: {mirrors: 9}}\n"))
	f.Add([]byte("deviceClasses:\n  - {name: w, volumeGroup: vg, spare: 1e3, lvcreateOptions: {stripes: 128, stripeSize: 4096}}\n"))
	f.Add([]byte("deviceClasses:\n  - {name: t, volumeGroup: vg, thinPool: pool_tmeta}\n"))
	f.Add([]byte("deviceClasses:\n  - {name: s, volumeGroup: vg, spare: 1e30}\n"))
	f.Add([]byte("deviceClasses:\n  - {name: s, volumeGroup: vg, spare: 4Ei}\n"))
	f.Add([]byte("deviceClasses:\n  - {name: a, volumeGroup: vg, overprovisionRatio: .nan, thinPool: p}\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			return
		}
		checkConfig(t, cfg)
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("writing the file back: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("the file written back does not load: %v\n%s", err, out)
		}
		if len(again.DeviceClasses) != len(cfg.DeviceClasses) {
			t.Fatalf("written back: %d classes, want %d", len(again.DeviceClasses), len(cfg.DeviceClasses))
		}
		for i, a := range cfg.DeviceClasses {
			b := again.DeviceClasses[i]
			if a.Name != b.Name || a.VolumeGroup != b.VolumeGroup || a.Default != b.Default || a.ThinPool != b.ThinPool ||
				a.Ratio() != b.Ratio() || a.LVCreateOptions != b.LVCreateOptions || a.SpareBytes() != b.SpareBytes() {
				t.Errorf("class %d written back is %+v, was %+v", i, b, a)
			}
		}
	})
}

func checkConfig(t *testing.T, cfg *Config) {
	t.Helper()
	if len(cfg.DeviceClasses) == 0 {
		t.Fatal("a file with no class loaded")
	}
	seen := map[string]bool{}
	defaults := 0
	for _, d := range cfg.DeviceClasses {
		if !dns1123Label.MatchString(d.Name) || len(d.Name) > 63 || seen[d.Name] {
			t.Errorf("class name %q: not a unique DNS-1123 label", d.Name)
		}
		seen[d.Name] = true
		if d.Default {
			defaults++
			if c, ok := cfg.Class(""); !ok || c.Name != d.Name {
				t.Errorf("the default class is %q, Class(\"\") gives %v", d.Name, c)
			}
		}
		// The spare is what the file says, in bytes that fit LVM.
		if d.Spare != nil && (d.SpareBytes() > lvm.MaxSize ||
			d.Spare.Sign() > 0 && d.Spare.Cmp(*resource.NewQuantity(int64(d.SpareBytes()), resource.BinarySI)) > 0) {
			t.Errorf("class %s: spare %s is read as %d bytes", d.Name, d.Spare, d.SpareBytes())
		}
		if r := d.Ratio(); r < 1 || math.IsNaN(r) || math.IsInf(r, 0) {
			t.Errorf("class %s: ratio %v", d.Name, r)
		}
		// The request CreateVolume makes for this class (any carve LV
		// name and tags): the lvm package must not refuse it.
		req := lvm.CreateRequest{VolumeGroup: d.VolumeGroup, Name: "carve-00112233445566778899aabbccddeeff", Size: 1 << 30,
			Tags: []string{"carve.dev/owner=carve", "carve.dev/class=" + d.Name}}
		if d.Thin() {
			req.ThinPool = d.ThinPool
		} else {
			req.Options = d.LVCreateOptions
		}
		if err := req.Validate(); err != nil {
			t.Errorf("class %s loaded, yet lvm refuses its volumes: %v", d.Name, err)
		}
	}
	if defaults > 1 {
		t.Errorf("%d default classes", defaults)
	}
}
