package volume

import (
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/lvmname"
)

func TestQuarantineName(t *testing.T) {
	name := LVNameFor("pvc-1")
	q, ok := QuarantineName(name)
	if !ok || q != "carve-orphan-"+name[len("carve-"):] || !IsQuarantineName(q) || IsQuarantineName(name) {
		t.Fatalf("QuarantineName(%s) = %q, %v", name, q, ok)
	}
	if err := lvmname.LV(q); err != nil {
		t.Errorf("quarantine name %q: %v", q, err)
	}
	for _, bad := range []string{q, "home", "carve-", SnapshotLVNameFor("s")} {
		if got, ok := QuarantineName(bad); ok {
			t.Errorf("QuarantineName(%q) = %q, want none", bad, got)
		}
	}
}

func TestQuarantinedFrom(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	name := LVNameFor("pvc-1")
	q, _ := QuarantineName(name)
	tests := []struct {
		name   string
		lv     string
		tags   []string
		want   Quarantined
		wantOK bool
	}{
		{"tagged", q, append([]string{TagOwner}, OrphanTags(name, at)...), Quarantined{Original: name, At: at}, true},
		{"renamed by hand: the name tells the original, no time", q, []string{TagOwner}, Quarantined{Original: name}, true},
		{"renamed back: a volume again", name, OrphanTags(name, at), Quarantined{}, false},
		{"a bad time is no time", q, []string{TagOrphanedAtPrefix + "x"}, Quarantined{Original: name}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := QuarantinedFrom(tt.lv, tt.tags)
			if ok != tt.wantOK || got.Original != tt.want.Original || !got.At.Equal(tt.want.At) {
				t.Errorf("QuarantinedFrom = %+v, %v; want %+v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
	for _, tag := range OrphanTags(name, at) {
		if !IsOrphanTag(tag) {
			t.Errorf("IsOrphanTag(%q) = false", tag)
		}
		if err := lvmname.Tag(tag); err != nil {
			t.Errorf("tag %q: %v", tag, err)
		}
	}
}
