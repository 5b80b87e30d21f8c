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
	blankChunk = 1 << 20
	// blankAlign is what O_DIRECT asks of offsets, lengths and buffers.
	blankAlign = 4096
)

// ReadsBlank tells whether device reads as zeros in every region a signature
// can live in. Stricter than blkid: leftovers still go to blkid, never
// straight to mkfs. O_DIRECT where allowed, so the device itself is judged.
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

// allZero compares b with itself shifted by one: no buffer of zeros.
func allZero(b []byte) bool {
	return len(b) == 0 || b[0] == 0 && bytes.Equal(b[1:], b[:len(b)-1])
}
