package changemap

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// store builds a COW device's content: the header (magic, valid,
// version, chunk size in sectors) and the areas holding the exceptions
// (origin chunk, COW chunk), each area's metadata chunk followed by its
// data chunks (left zero), and an end marker after the last unless the
// area is full.
func store(magic, valid, version, sectors uint32, exceptions [][2]uint64) []byte {
	chunk := int(sectors) * 512
	perArea := chunk / exceptionLen
	areas := len(exceptions)/perArea + 1
	b := make([]byte, (1+areas*(perArea+1))*chunk)
	le := binary.LittleEndian
	le.PutUint32(b[0:], magic)
	le.PutUint32(b[4:], valid)
	le.PutUint32(b[8:], version)
	le.PutUint32(b[12:], sectors)
	for i, e := range exceptions {
		area, n := i/perArea, i%perArea
		at := (1+area*(perArea+1))*chunk + n*exceptionLen
		le.PutUint64(b[at:], e[0])
		le.PutUint64(b[at+8:], e[1])
	}
	return b
}

// TestParseExceptions: each exception names its origin chunk, whole;
// the table ends at the first entry with COW chunk 0, also across
// areas; a store that is not valid is refused.
func TestParseExceptions(t *testing.T) {
	const k4 = 4096
	// A 4 KiB chunk holds 256 exceptions an area.
	full := make([][2]uint64, 256+3)
	var fullWant Set
	for i := range full {
		full[i] = [2]uint64{uint64(1000 + 2*i), uint64(2 + i)}
		fullWant = fullWant.Add(uint64(1000+2*i)*k4, k4)
	}
	tests := []struct {
		name    string
		dev     []byte
		want    Set
		wantErr string
	}{
		{"empty table", store(cowMagic, 1, 1, 8, nil), nil, ""},
		{"scattered and neighbours", store(cowMagic, 1, 1, 8, [][2]uint64{{5, 2}, {9, 3}, {6, 4}, {0, 5}}),
			Set{{0, k4}, {5 * k4, 2 * k4}, {9 * k4, k4}}, ""},
		{"64 KiB chunks", store(cowMagic, 1, 1, 128, [][2]uint64{{3, 2}}), Set{{3 * 65536, 65536}}, ""},
		{"more than an area", store(cowMagic, 1, 1, 8, full), fullWant, ""},
		{"a full store has no next area", store(cowMagic, 1, 1, 8, full[:256])[:(1+257)*k4], fullWant[:256], ""},
		{"not a store", make([]byte, 8*k4), nil, "not a persistent exception store"},
		{"invalid", store(cowMagic, 0, 1, 8, nil), nil, "marked invalid"},
		{"version", store(cowMagic, 1, 2, 8, nil), nil, "version 2"},
		{"chunk not a power of 2", store(cowMagic, 1, 1, 24, nil), nil, "power of 2"},
		{"chunk too small", store(cowMagic, 1, 1, 1, nil), nil, "power of 2"},
		{"cut short", store(cowMagic, 1, 1, 8, nil)[:k4], nil, "area 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseExceptions(bytes.NewReader(tt.dev))
			checkSet(t, got, err, tt.want, tt.wantErr)
		})
	}
}
