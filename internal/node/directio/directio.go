// Package directio opens devices with O_DIRECT and makes the aligned
// buffers it needs.
package directio

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Align is what O_DIRECT asks of offsets, lengths and buffers on the block
// devices carve meets (512 or 4096-byte logical blocks).
const Align = 4096

// Open opens path, with O_DIRECT when direct and the filesystem takes it
// (tmpfs refuses: EINVAL).
func Open(path string, flag int, direct bool) (*os.File, error) {
	if direct {
		f, err := os.OpenFile(path, flag|unix.O_DIRECT, 0) //nolint:gosec // G304: device paths the node built from validated LVM names
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("opening %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, flag, 0) //nolint:gosec // G304: as above
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	return f, nil
}

// Buffer is n bytes of an anonymous mapping, given back to the kernel at
// once by release (called once, after the last use) rather than at the next
// GC.
func Buffer(n int) (buf []byte, release func(), err error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("allocating a %d-byte buffer: %w", n, err)
	}
	return b, func() { _ = unix.Munmap(b) }, nil
}

// Aligned is n Align-aligned bytes from the Go heap, for pipeline buffers
// whose last use no one place knows.
func Aligned(n int) []byte {
	b := make([]byte, n+Align)
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) % Align); r != 0 { //nolint:gosec // G103: only to align a buffer for O_DIRECT
		skip = Align - r
	}
	return b[skip : skip+n : skip+n]
}
