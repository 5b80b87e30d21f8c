package lvm

import (
	"errors"
	"strings"
	"testing"
)

// TestParseThinID: the one row of the LV asked is its thin ID; none is
// ErrNotFound; an LV that is not thin (an empty thin_id, as lvs prints for
// a thick LV) or of several segments is an error.
func TestParseThinID(t *testing.T) {
	row := func(name, id string) string { return `{"lv_name":"` + name + `", "thin_id":"` + id + `"}` }
	report := func(rows ...string) []byte {
		return []byte(`{"report": [{"lv": [` + strings.Join(rows, ",") + `]}]}`)
	}
	for _, tt := range []struct {
		name string
		out  []byte
		want uint64
		err  string
	}{
		{"thin", report(row("snap", "7")), 7, ""},
		{"among others", report(row("other", "3"), row("snap", "12")), 12, ""},
		{"missing", report(row("other", "3")), 0, "not found"},
		{"thick", report(row("snap", "")), 0, "not one thin segment"},
		{"two segments", report(row("snap", "1"), row("snap", "2")), 0, "not one thin segment"},
		{"not a number", report(row("snap", "x")), 0, "invalid syntax"},
		{"not JSON", []byte("WARNING"), 0, "invalid character"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseThinID(tt.out, "vg", "snap")
			if tt.err == "" && (err != nil || got != tt.want) || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("got %d, %v; want %d, an error saying %q", got, err, tt.want, tt.err)
			}
			if tt.name == "missing" && !errors.Is(err, ErrNotFound) {
				t.Errorf("a missing LV: %v, want ErrNotFound", err)
			}
		})
	}
}
