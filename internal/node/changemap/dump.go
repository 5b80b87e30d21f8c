package changemap

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
)

// ParseThinDump reads thin_dump's XML (thin-provisioning-tools 0.9) of
// the one thin device dev (thin_dump --dev-id) and returns the bytes
// that device maps, in the pool's blocks (superblock data_block_size,
// in 512-byte sectors). A dump of another device, of several, or of
// none is an error: a device with no mapping is still listed, empty.
func ParseThinDump(r io.Reader, dev uint64) (Set, error) {
	dec := xml.NewDecoder(r)
	var set Set
	var block uint64
	devices := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("thin_dump's output: %w", err)
		}
		t, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		switch t.Name.Local {
		case "superblock":
			b, err := uintAttr(t, "data_block_size")
			if err != nil {
				return nil, err
			}
			if b == 0 {
				return nil, errors.New("thin_dump's output: data_block_size is 0")
			}
			block = b * 512
		case "device":
			id, err := uintAttr(t, "dev_id")
			if err != nil {
				return nil, err
			}
			if id != dev {
				return nil, fmt.Errorf("thin_dump's output: device %d, want %d", id, dev)
			}
			devices++
		case "single_mapping", "range_mapping":
			if block == 0 || devices != 1 {
				return nil, fmt.Errorf("thin_dump's output: <%s> outside one <device> of a <superblock>", t.Name.Local)
			}
			var begin, n uint64
			if t.Name.Local == "single_mapping" {
				begin, err = uintAttr(t, "origin_block")
				n = 1
			} else if begin, err = uintAttr(t, "origin_begin"); err == nil {
				n, err = uintAttr(t, "length")
			}
			if err != nil {
				return nil, err
			}
			if most := (1<<64 - 1) / block; n > most || begin > most-n {
				return nil, fmt.Errorf("thin_dump's output: <%s> at block %d of %d is out of range", t.Name.Local, begin, n)
			}
			set = set.Add(begin*block, n*block)
		default:
			return nil, fmt.Errorf("thin_dump's output: unknown element <%s>", t.Name.Local)
		}
	}
	if devices != 1 {
		return nil, fmt.Errorf("thin_dump's output: %d <device> elements, want 1", devices)
	}
	return set, nil
}
