package changemap

import (
	"slices"
	"testing"
)

func TestSetAdd(t *testing.T) {
	tests := []struct {
		name string
		adds []Extent
		want Set
	}{
		{"empty", nil, nil},
		{"nothing added", []Extent{{10, 0}}, nil},
		{"one", []Extent{{10, 5}}, Set{{10, 5}}},
		{"apart, out of order", []Extent{{100, 5}, {10, 5}, {50, 1}}, Set{{10, 5}, {50, 1}, {100, 5}}},
		{"touching merge", []Extent{{10, 5}, {15, 5}, {5, 5}}, Set{{5, 15}}},
		{"overlapping merge", []Extent{{10, 10}, {15, 10}}, Set{{10, 15}}},
		{"one swallows several", []Extent{{10, 1}, {20, 1}, {30, 1}, {40, 1}, {15, 20}}, Set{{10, 1}, {15, 20}, {40, 1}}},
		{"inside", []Extent{{10, 20}, {12, 2}}, Set{{10, 20}}},
		{"bridges two", []Extent{{10, 5}, {20, 5}, {15, 5}}, Set{{10, 15}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Set
			for _, e := range tt.adds {
				s = s.Add(e.Off, e.Len)
			}
			if !slices.Equal(s, tt.want) {
				t.Errorf("got %v, want %v", s, tt.want)
			}
		})
	}
}

func TestSetOverlaps(t *testing.T) {
	s := Set{{10, 5}, {40, 10}}
	tests := []struct {
		off, end uint64
		want     bool
	}{
		{0, 10, false}, {0, 11, true}, {14, 15, true}, {15, 40, false}, {15, 41, true},
		{49, 60, true}, {50, 60, false}, {0, 100, true}, {12, 13, true},
	}
	for _, tt := range tests {
		if got := s.Overlaps(tt.off, tt.end); got != tt.want {
			t.Errorf("[%d, %d): %v, want %v", tt.off, tt.end, got, tt.want)
		}
	}
	if Set(nil).Overlaps(0, 100) {
		t.Error("the empty set overlaps")
	}
	if got := s.Bytes(); got != 15 {
		t.Errorf("Bytes %d, want 15", got)
	}
}

func TestDMName(t *testing.T) {
	for _, tt := range []struct{ vg, lv, layer, want string }{
		{"vg", "lv", "", "vg-lv"},
		{"my-vg", "carve-a-b", "", "my--vg-carve--a--b"},
		{"vg", "pool", "tpool", "vg-pool-tpool"},
		{"v-g", "pool_tmeta", "", "v--g-pool_tmeta"},
		{"vg", "snap-1", "cow", "vg-snap--1-cow"},
	} {
		if got := dmName(tt.vg, tt.lv, tt.layer); got != tt.want {
			t.Errorf("dmName(%q, %q, %q) = %q, want %q", tt.vg, tt.lv, tt.layer, got, tt.want)
		}
	}
}
