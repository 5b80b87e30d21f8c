package changemap

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// toolXML reads a thin-provisioning-tools program's XML; its value, the
// program's name, is in every error.
type toolXML string

func (x toolXML) errorf(format string, a ...any) error {
	return fmt.Errorf(string(x)+"'s output: "+format, a...)
}

func (x toolXML) next(dec *xml.Decoder) (xml.Token, error) {
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		if err != nil {
			return nil, x.errorf("%w", err)
		}
		switch tok.(type) {
		case xml.StartElement, xml.EndElement:
			return tok, nil
		}
	}
}

func (x toolXML) uint(t xml.StartElement, name string) (uint64, error) {
	for _, a := range t.Attr {
		if a.Name.Local == name {
			v, err := strconv.ParseUint(a.Value, 10, 64)
			if err != nil {
				return 0, x.errorf("<%s %s=%q>: %w", t.Name.Local, name, a.Value, err)
			}
			return v, nil
		}
	}
	return 0, x.errorf("<%s> without %s", t.Name.Local, name)
}

// blockBytes is a <superblock>'s data block size in bytes (given in
// sectors).
func (x toolXML) blockBytes(t xml.StartElement) (uint64, error) {
	b, err := x.uint(t, "data_block_size")
	if err != nil {
		return 0, err
	}
	if b == 0 || b > (1<<64-1)/512 {
		return 0, x.errorf("data_block_size is %d", b)
	}
	return b * 512, nil
}

// add refuses a range that does not fit in 64 bits of bytes.
func (x toolXML) add(set Set, t xml.StartElement, begin, n, block uint64) (Set, error) {
	if most := (1<<64 - 1) / block; n > most || begin > most-n {
		return nil, x.errorf("<%s> at block %d of %d is out of range", t.Name.Local, begin, n)
	}
	return set.Add(begin*block, n*block), nil
}

func hasAttr(t xml.StartElement, name string) bool {
	for _, a := range t.Attr {
		if a.Name.Local == name {
			return true
		}
	}
	return false
}
