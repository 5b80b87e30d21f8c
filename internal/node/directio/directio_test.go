package directio

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"
)

// TestBuffers: both kinds of buffer are of the size asked and start on
// an Align boundary.
func TestBuffers(t *testing.T) {
	for _, n := range []int{1, Align, 3*Align + 5, 4 << 20} {
		a := Aligned(n)
		b, release, err := Buffer(n)
		if err != nil {
			t.Fatal(err)
		}
		for name, buf := range map[string][]byte{"Aligned": a, "Buffer": b} {
			if len(buf) != n || uintptr(unsafe.Pointer(&buf[0]))%Align != 0 {
				t.Errorf("%s(%d): %d bytes at %p, want %d at a multiple of %d", name, n, len(buf), &buf[0], n, Align)
			}
		}
		if cap(a) != n {
			t.Errorf("Aligned(%d) has room for %d: an append would write past it unnoticed", n, cap(a))
		}
		release()
	}
	// Small heap objects share pages at any 8- or 16-byte place: many of
	// them, kept alive, meet most of the offsets Aligned must skip.
	var keep [][]byte
	for i := range 256 {
		n := 1 + i*37
		a := Aligned(n)
		if len(a) != n || uintptr(unsafe.Pointer(&a[0]))%Align != 0 {
			t.Fatalf("Aligned(%d): %d bytes at %p, want %d at a multiple of %d", n, len(a), &a[0], n, Align)
		}
		keep = append(keep, a)
	}
	_ = keep
}

// TestOpen: a file is opened with O_DIRECT where its filesystem takes
// it and without where it does not (tmpfs), and reads what it holds
// either way; a missing file is an error naming it.
func TestOpen(t *testing.T) {
	dirs := []string{t.TempDir()}
	// /dev/shm is a tmpfs, which refuses O_DIRECT before Linux 6.6.
	if shm, err := os.MkdirTemp("/dev/shm", "directio-"); err == nil {
		t.Cleanup(func() { _ = os.RemoveAll(shm) })
		dirs = append(dirs, shm)
	}
	want := bytes.Repeat([]byte{7}, 2*Align)
	for _, dir := range dirs {
		p := filepath.Join(dir, "dev")
		if err := os.WriteFile(p, want, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, direct := range []bool{false, true} {
			f, err := Open(p, os.O_RDONLY, direct)
			if err != nil {
				t.Fatalf("Open(%s, direct %t): %v", p, direct, err)
			}
			buf := Aligned(len(want))
			if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, want) {
				t.Errorf("%s, direct %t: read %v, the file's bytes: %t", p, direct, err, bytes.Equal(buf, want))
			}
			_ = f.Close()
		}
	}
	missing := filepath.Join(t.TempDir(), "none")
	if _, err := Open(missing, os.O_RDONLY, true); err == nil || !bytes.Contains([]byte(err.Error()), []byte(missing)) {
		t.Errorf("Open of a missing file: %v, want an error naming it", err)
	}
}
