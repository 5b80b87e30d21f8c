package fs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/carve-csi/carve/internal/node/directio"
	"github.com/carve-csi/carve/internal/node/erase"
)

const (
	// blankChunk is the size of each read.
	blankChunk = 1 << 20
	// blankAlign is what O_DIRECT asks of offsets, lengths and buffers.
	blankAlign = 4096
)

// ReadsBlank tells whether device (a block device, or a file in tests)
// reads as zeros in every region where a signature can live
// (erase.SignatureRegions: the first 4 MiB and 4 KiB, the last 2 MiB,
// which hold every offset libblkid probes before it finds a magic; all
// of a smaller device;
// CreateVolume zeroes them on a new thick filesystem volume). Then no tool
// can find a signature on it: blkid would exit 2, and the device may be
// formatted without running it. Any byte that is not zero answers false,
// whether or not it belongs to a signature: this is stricter than blkid,
// which finds nothing on a device with leftover data but no signature, so
// such a device still goes to blkid, never straight to mkfs.
//
// The device is read with O_DIRECT, past the page cache, so that what is
// judged is what is on the device (a filesystem that refuses O_DIRECT, as
// tmpfs does for test files, is read through the cache).
func ReadsBlank(device string) (bool, error) {
	f, err := directio.Open(device, os.O_RDONLY, true)
	if err != nil {
		return false, err
	}
	defer f.Close() //nolint:errcheck // read-only; nothing to flush
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return false, fmt.Errorf("size of %s: %w", device, err)
	}
	buf, release, err := directio.Buffer(blankChunk)
	if err != nil {
		return false, fmt.Errorf("the read buffer: %w", err)
	}
	defer release()

	for _, r := range erase.SignatureRegions(size) {
		for off := r[0]; off < r[1]; {
			// Whole aligned chunks; the last one may reach past the end,
			// where the read stops short.
			n := min(int64(blankChunk), (r[1]-off+blankAlign-1)/blankAlign*blankAlign)
			got, err := f.ReadAt(buf[:n], off)
			if err != nil && !errors.Is(err, io.EOF) {
				return false, fmt.Errorf("reading %s at %d: %w", device, off, err)
			}
			if !allZero(buf[:got]) {
				return false, nil
			}
			if int64(got) < n {
				break // the end of the device
			}
			off += n
		}
	}
	return true, nil
}

// allZero tells whether every byte of b is zero: the first is, and each
// equals the one before it (one bytes.Equal, which is vectorised, and no
// second buffer of zeros).
func allZero(b []byte) bool {
	return len(b) == 0 || b[0] == 0 && bytes.Equal(b[1:], b[:len(b)-1])
}
