package changemap

import (
	"encoding/xml"
	"io"
)

// ParseThinDump reads thin_dump's XML (thin-provisioning-tools 0.9) of the
// one thin device dev and returns the bytes it maps, in the pool's blocks. A
// dump of another device, several, or none is an error.
func ParseThinDump(r io.Reader, dev uint64) (Set, error) {
	const x = toolXML("thin_dump")
	var set Set
	var block uint64
	devices := 0
	for tok, err := range x.elements(r) {
		if err != nil {
			return nil, err
		}
		t, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		switch t.Name.Local {
		case "superblock":
			if block, err = x.blockBytes(t); err != nil {
				return nil, err
			}
		case "device":
			id, err := x.uint(t, "dev_id")
			if err != nil {
				return nil, err
			}
			if id != dev {
				return nil, x.errorf("device %d, want %d", id, dev)
			}
			devices++
		case "single_mapping", "range_mapping":
			if block == 0 || devices != 1 {
				return nil, x.errorf("<%s> outside one <device> of a <superblock>", t.Name.Local)
			}
			begin, length := "origin_begin", "length"
			if t.Name.Local == "single_mapping" {
				begin, length = "origin_block", ""
			}
			if set, err = x.add(set, t, begin, length, block); err != nil {
				return nil, err
			}
		default:
			return nil, x.errorf("unknown element <%s>", t.Name.Local)
		}
	}
	if devices != 1 {
		return nil, x.errorf("%d <device> elements, want 1", devices)
	}
	return set, nil
}
