package changemap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"

	"github.com/carve-csi/carve/internal/node/directio"
)

// The persistent exception store of a dm snapshot (dm-snap-persistent.c), on
// its "-cow" device: chunk 0 is the header; then areas of one metadata chunk
// of 16-byte exceptions (origin chunk, COW chunk, little-endian) followed by
// as many data chunks. The first exception whose new chunk is 0 ends it.
const (
	cowMagic     = 0x70416e53 // "SnAp"
	cowVersion   = 1
	exceptionLen = 16
	headerRead   = 4096 // what O_DIRECT reads of the header
	// maxChunkSectors is twice LVM's largest chunk (512 KiB).
	maxChunkSectors = 2048
)

// ParseExceptions reads a snapshot's exception table from its COW device and
// returns the origin's bytes written since the snapshot (whole chunks): the
// only places where the two may differ. An invalid store, another version,
// or a missing magic is an error.
func ParseExceptions(r io.ReaderAt) (Set, error) {
	hdr, free := alignedBuf(headerRead)
	defer free()
	if _, err := r.ReadAt(hdr, 0); err != nil && !(errors.Is(err, io.EOF)) {
		return nil, fmt.Errorf("reading the exception store's header: %w", err)
	}
	le := binary.LittleEndian
	switch {
	case le.Uint32(hdr[0:4]) != cowMagic:
		return nil, fmt.Errorf("not a persistent exception store: magic %#x, want %#x", le.Uint32(hdr[0:4]), cowMagic)
	case le.Uint32(hdr[4:8]) == 0:
		return nil, errors.New("the exception store is marked invalid (the snapshot overflowed)")
	case le.Uint32(hdr[8:12]) != cowVersion:
		return nil, fmt.Errorf("exception store version %d, want %d", le.Uint32(hdr[8:12]), cowVersion)
	}
	sectors := uint64(le.Uint32(hdr[12:16]))
	if sectors < headerRead/512 || sectors&(sectors-1) != 0 || sectors > maxChunkSectors {
		return nil, fmt.Errorf("exception store chunk size %d sectors: want a power of 2 from %d to %d", sectors, headerRead/512, maxChunkSectors)
	}
	chunk := sectors * 512
	perArea := chunk / exceptionLen
	meta, freeMeta := alignedBuf(int(chunk))
	defer freeMeta()
	var set Set
	for area := uint64(0); ; area++ {
		at := (1 + area*(perArea+1)) * chunk
		if _, err := r.ReadAt(meta, int64(at)); err != nil {
			if errors.Is(err, io.EOF) && area > 0 {
				return set, nil // the store is full: no area after the last
			}
			return nil, fmt.Errorf("reading the exception area %d at %d: %w", area, at, err)
		}
		for i := uint64(0); i < perArea; i++ {
			e := meta[i*exceptionLen:]
			old, cow := le.Uint64(e[0:8]), le.Uint64(e[8:16])
			if cow == 0 {
				return set, nil
			}
			if old > (1<<64-1)/chunk-1 {
				return nil, fmt.Errorf("exception area %d entry %d: origin chunk %d is out of range", area, i, old)
			}
			set = set.Add(old*chunk, chunk)
		}
	}
}

func alignedBuf(n int) ([]byte, func()) {
	b, release, err := directio.Buffer(n)
	if err != nil {
		return make([]byte, n), func() {} // an O_DIRECT read of it then fails, and the caller falls back
	}
	return b, release
}

// SnapshotChanges names the origin bytes written since thick snapshot snap
// was taken, from its active COW device, read O_DIRECT: the snapshot target
// writes that device past the page cache.
func (f *Finder) SnapshotChanges(_ context.Context, vg, snap string) (Set, error) {
	if err := checkName("volume group", vg); err != nil {
		return nil, err
	}
	if err := checkName("snapshot", snap); err != nil {
		return nil, err
	}
	dev := path.Join(f.DevDir, "mapper", dmName(vg, snap, "cow"))
	in, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT, 0) //nolint:gosec // G304: a device path built from checked LVM names
	if err != nil {
		return nil, fmt.Errorf("opening the COW device of %s/%s: %w", vg, snap, err)
	}
	defer in.Close() //nolint:errcheck // read-only
	set, err := ParseExceptions(in)
	if err != nil {
		return nil, fmt.Errorf("the exception table of %s/%s (%s): %w", vg, snap, dev, err)
	}
	return set, nil
}
