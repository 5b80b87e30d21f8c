// Package changemap names, from device-mapper metadata without reading data,
// where a volume may differ from a snapshot of it: thin_delta over a pool's
// mapping trees, or a copy-on-write snapshot's exception table. It names a
// superset, in pool blocks or snapshot chunks: an unnamed place is the same.
package changemap

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Extent is Len bytes at byte offset Off.
type Extent struct {
	Off, Len uint64
}

// Set is a set of byte extents: sorted, not overlapping, not touching.
type Set []Extent

// Add puts [off, off+n) into s and returns the set.
func (s Set) Add(off, n uint64) Set {
	if n == 0 {
		return s
	}
	end := off + n
	i, _ := slices.BinarySearchFunc(s, off, func(e Extent, off uint64) int {
		switch {
		case e.Off+e.Len < off:
			return -1
		case e.Off > off:
			return 1
		}
		return 0
	})
	j := i
	for j < len(s) && s[j].Off <= end {
		off, end = min(off, s[j].Off), max(end, s[j].Off+s[j].Len)
		j++
	}
	return slices.Replace(s, i, j, Extent{Off: off, Len: end - off})
}

// Bytes is how many bytes s holds.
func (s Set) Bytes() uint64 {
	var n uint64
	for _, e := range s {
		n += e.Len
	}
	return n
}

// Overlaps tells whether any byte of [off, end) is in s.
func (s Set) Overlaps(off, end uint64) bool {
	i, _ := slices.BinarySearchFunc(s, off, func(e Extent, off uint64) int {
		if e.Off+e.Len <= off {
			return -1
		}
		return 1
	})
	return i < len(s) && s[i].Off < end
}

// name is LVM's name alphabet (lvm(8)), checked again here as names reach
// device paths and command lines.
var name = regexp.MustCompile(`^[a-zA-Z0-9+_.][a-zA-Z0-9+_.-]*$`)

func checkName(what, n string) error {
	if len(n) > 127 || !name.MatchString(n) {
		return fmt.Errorf("%s %q is not an LVM name", what, n)
	}
	return nil
}

// dmName is the device-mapper name LVM gives vg/lv (and its layer): each
// '-' doubled, joined by '-'.
func dmName(vg, lv, layer string) string {
	n := strings.ReplaceAll(vg, "-", "--") + "-" + strings.ReplaceAll(lv, "-", "--")
	if layer != "" {
		n += "-" + layer
	}
	return n
}
