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

// ReadsBlank tells whether device reads as zeros in every region where a
// signature can live (erase.SignatureRegions; CreateVolume zeroes them on a
// new thick filesystem volume): then blkid would find nothing, and the device
// may be formatted without running it. Any nonzero byte answers false, which
// is stricter than blkid, so leftover data still goes to blkid, never
// straight to mkfs. It reads with O_DIRECT, so that what is judged is on the
// device, except where the filesystem refuses it (tmpfs in tests).
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
