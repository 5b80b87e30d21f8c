package driver

import (
	"regexp"
	"strings"
	"testing"
)

func TestLVNameFor(t *testing.T) {
	lvName := regexp.MustCompile(`^carve-[0-9a-f]{32}$`)
	names := []string{"pvc-0a1b", strings.Repeat("x", 300), "sanity name with spaces/and:colons", ""}
	seen := map[string]string{}
	for _, n := range names {
		got := LVNameFor(n)
		if !lvName.MatchString(got) {
			t.Errorf("LVNameFor(%q) = %q, not of LVM's alphabet and length", n, got)
		}
		if got != LVNameFor(n) {
			t.Errorf("LVNameFor(%q) is not deterministic", n)
		}
		if other, ok := seen[got]; ok {
			t.Errorf("LVNameFor(%q) == LVNameFor(%q)", n, other)
		}
		seen[got] = n
	}
}

func TestParseVolumeID(t *testing.T) {
	lv := LVNameFor("a")
	tests := []struct {
		id      string
		vg, lv  string
		wantErr bool
	}{
		{id: VolumeID("vg0", lv), vg: "vg0", lv: lv},
		{id: "vg0", wantErr: true},
		{id: "/" + lv, wantErr: true},
		{id: "vg0/other", wantErr: true},
		{id: "vg0/" + lv + "/x", wantErr: true},
		{id: "", wantErr: true},
		{id: "../" + lv, wantErr: true},
		{id: "-vg/" + lv, wantErr: true},
		{id: "vg 0/" + lv, wantErr: true},
		{id: "vg0/" + lv + "_tmeta", wantErr: true},
	}
	for _, tt := range tests {
		vg, lv, err := ParseVolumeID(tt.id)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseVolumeID(%q) error = %v, want error %v", tt.id, err, tt.wantErr)
			continue
		}
		if vg != tt.vg || lv != tt.lv {
			t.Errorf("ParseVolumeID(%q) = %q, %q; want %q, %q", tt.id, vg, lv, tt.vg, tt.lv)
		}
	}
}
