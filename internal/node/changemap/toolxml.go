package changemap

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"iter"
	"strconv"
)

// toolXML reads a thin-provisioning-tools program's XML; its value, the
// program's name, is in every error.
type toolXML string

func (x toolXML) errorf(format string, a ...any) error {
	return fmt.Errorf(string(x)+"'s output: "+format, a...)
}

// elements are r's start and end elements in order; an unreadable r ends
// them with the error.
func (x toolXML) elements(r io.Reader) iter.Seq2[xml.Token, error] {
	return func(yield func(xml.Token, error) bool) {
		dec := xml.NewDecoder(r)
		for {
			tok, err := dec.Token()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				yield(nil, x.errorf("%w", err))
				return
			}
			switch tok.(type) {
			case xml.StartElement, xml.EndElement:
				if !yield(tok, nil) {
					return
				}
			}
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

// add adds the blocks t names, from its begin attribute for its length
// attribute's count of blocks (one block when length is ""), and refuses a
// range that does not fit in 64 bits of bytes.
func (x toolXML) add(set Set, t xml.StartElement, begin, length string, block uint64) (Set, error) {
	first, err := x.uint(t, begin)
	if err != nil {
		return nil, err
	}
	n := uint64(1)
	if length != "" {
		if n, err = x.uint(t, length); err != nil {
			return nil, err
		}
	}
	if most := (1<<64 - 1) / block; n > most || first > most-n {
		return nil, x.errorf("<%s> at block %d of %d is out of range", t.Name.Local, first, n)
	}
	return set.Add(first*block, n*block), nil
}

func hasAttr(t xml.StartElement, name string) bool {
	for _, a := range t.Attr {
		if a.Name.Local == name {
			return true
		}
	}
	return false
}
