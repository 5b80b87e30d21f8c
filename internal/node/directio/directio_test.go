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
			if len(buf) != n || uintptr(unsafe.Pointer(&buf[0]))%Align != 0 { //nolint:gosec // G103: the test reads the address
				t.Errorf("%s(%d): %d bytes at %p, want %d at a multiple of %d", name, n, len(buf), &buf[0], n, Align)
			}
		}
		if cap(a) != n {
			t.Errorf("Aligned(%d) has room for %d: an append would write past it unnoticed", n, cap(a))
		}
		release()
	}
}

// TestOpen: a file is opened with O_DIRECT where its filesystem takes
// it and without where it does not (tmpfs), and reads what it holds
// either way; a missing file is an error naming it.
func TestOpen(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dev")
	want := bytes.Repeat([]byte{7}, 2*Align)
	if err := os.WriteFile(p, want, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, direct := range []bool{false, true} {
		f, err := Open(p, os.O_RDONLY, direct)
		if err != nil {
			t.Fatalf("Open(direct %t): %v", direct, err)
		}
		buf := Aligned(len(want))
		if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, want) {
			t.Errorf("direct %t: read %v, the file's bytes: %t", direct, err, bytes.Equal(buf, want))
		}
		_ = f.Close()
	}
	missing := filepath.Join(t.TempDir(), "none")
	if _, err := Open(missing, os.O_RDONLY, true); err == nil || !bytes.Contains([]byte(err.Error()), []byte(missing)) {
		t.Errorf("Open of a missing file: %v, want an error naming it", err)
	}
}
