package paging

import (
	"errors"
	"testing"
)

// TestWalk: pages within the limits pass; one past any limit, or a token
// handed out before (also the starting one), is refused.
func TestWalk(t *testing.T) {
	limits := Limits{Pages: 3, Entries: 10, Bytes: 100}
	type page struct {
		entries, bytes int
		next           string
	}
	tests := []struct {
		name   string
		start  string
		pages  []page
		refuse bool // the last page is refused
	}{
		{name: "within the limits", pages: []page{{4, 40, "a"}, {4, 40, "b"}, {2, 20, ""}}},
		{name: "one page too many", pages: []page{{1, 1, "a"}, {1, 1, "b"}, {1, 1, "c"}, {1, 1, "d"}}, refuse: true},
		{name: "too many entries", pages: []page{{6, 1, "a"}, {5, 1, ""}}, refuse: true},
		{name: "too many bytes", pages: []page{{1, 60, "a"}, {1, 41, ""}}, refuse: true},
		{name: "a token seen before", pages: []page{{1, 1, "a"}, {1, 1, "b"}, {1, 1, "a"}}, refuse: true},
		{name: "the starting token again", start: "s", pages: []page{{1, 1, "s"}}, refuse: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := New(limits, tt.start)
			for i, p := range tt.pages {
				err := w.Page(p.entries, p.bytes, p.next)
				last := i == len(tt.pages)-1
				if want := last && tt.refuse; (err != nil) != want || (err != nil && !errors.Is(err, ErrRefused)) {
					t.Fatalf("page %d: %v, want refused %t", i, err, want)
				}
			}
		})
	}
}
