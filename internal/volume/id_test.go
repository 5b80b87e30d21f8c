package volume

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

func TestParseSnapshotID(t *testing.T) {
	snap := SnapshotLVNameFor("snapshot-1")
	tests := []struct {
		id           string
		node, vg, lv string
		wantErr      bool
	}{
		{id: "node-a/vg0/" + snap, node: "node-a", vg: "vg0", lv: snap},
		{id: "node.example.com/vg0/" + snap, node: "node.example.com", vg: "vg0", lv: snap},
		{id: "vg0/" + snap, wantErr: true},
		{id: "node-a/vg0/" + LVNameFor("v"), wantErr: true},
		{id: "Node_A/vg0/" + snap, wantErr: true},
		{id: "node-a/../" + snap, wantErr: true},
		{id: "node-a/vg0/" + snap + "/x", wantErr: true},
		{id: "/vg0/" + snap, wantErr: true},
		{id: "non-existing-snapshot-id", wantErr: true},
	}
	for _, tt := range tests {
		node, vg, lv, err := ParseSnapshotID(tt.id)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseSnapshotID(%q) error %v, want error %v", tt.id, err, tt.wantErr)
			continue
		}
		if !tt.wantErr && (node != tt.node || vg != tt.vg || lv != tt.lv) {
			t.Errorf("ParseSnapshotID(%q) = %q, %q, %q", tt.id, node, vg, lv)
		}
	}
}

func TestOwned(t *testing.T) {
	tests := []struct {
		name      string
		tags      []string
		kind      Kind
		class     string
		wantOwned bool
	}{
		{"volume", VolumeTags("pvc-1", "fast", nil), KindVolume, "fast", true},
		{"snapshot", SnapshotTags("snap-1", "fast", LVNameFor("pvc-1")), KindSnapshot, "fast", true},
		{"not carve's", []string{TagSnapshotPrefix + "x", TagClassPrefix + "fast"}, 0, "", false},
	}
	for _, tt := range tests {
		kind, class, ok := Owned(tt.tags)
		if kind != tt.kind || class != tt.class || ok != tt.wantOwned {
			t.Errorf("%s: Owned = %v, %q, %v; want %v, %q, %v", tt.name, kind, class, ok, tt.kind, tt.class, tt.wantOwned)
		}
	}
}

func TestParseID(t *testing.T) {
	lv := LVNameFor("a")
	id, err := ParseID(VolumeID("vg0", lv))
	if err != nil || id != (ID{VG: "vg0", LV: lv}) || id.String() != VolumeID("vg0", lv) {
		t.Errorf("ParseID = %+v, %v", id, err)
	}
	for _, bad := range []string{"", "vg0", "vg0/other", "vg0/" + lv + "/x", "../" + lv} {
		if id, err := ParseID(bad); err == nil || id != (ID{}) {
			t.Errorf("ParseID(%q) = %+v, %v; want an error", bad, id, err)
		}
	}
}
