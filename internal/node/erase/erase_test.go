package erase

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// pattern writes size bytes of 0xA5 to a new file and returns its path.
func pattern(t *testing.T, size int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dev")
	if err := os.WriteFile(p, bytes.Repeat([]byte{0xA5}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDeviceLeavesOnlyZeros(t *testing.T) {
	// Not a multiple of the write buffer, and over a chunk, so that the
	// last partial write and the chunk boundary are both covered.
	const size = chunk + writeBuffer + 4097
	p := pattern(t, size)
	n, err := Device(context.Background(), p, Write)
	if err != nil || n != size {
		t.Fatalf("Device(write) = %d, %v; want %d, nil", n, err, size)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != size || !bytes.Equal(got, make([]byte, size)) {
		t.Fatalf("after erasing, the file has %d bytes, not all zero", len(got))
	}
}

func TestDeviceNoneLeavesTheDeviceAsItIs(t *testing.T) {
	p := pattern(t, 8192)
	if n, err := Device(context.Background(), p, None); err != nil || n != 0 {
		t.Fatalf("Device(none) = %d, %v; want 0, nil", n, err)
	}
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, bytes.Repeat([]byte{0xA5}, 8192)) {
		t.Fatal("method none changed the device")
	}
}

func TestDeviceRefuses(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		m    Method
		is   error
	}{
		{"an unknown method", context.Background(), Method("shred"), nil},
		// BLKZEROOUT exists for block devices only: a file is an error,
		// never a silent success.
		{"zeroout of a file", context.Background(), ZeroOut, syscall.ENOTTY},
		{"an ended context", canceled, Write, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pattern(t, 4096)
			if _, err := Device(tc.ctx, p, tc.m); err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("Device = %v; want an error (%v)", err, tc.is)
			}
			got, _ := os.ReadFile(p)
			if !bytes.Equal(got, bytes.Repeat([]byte{0xA5}, 4096)) {
				t.Fatal("a refused erase changed the device")
			}
		})
	}
}

func TestIsMethod(t *testing.T) {
	for s, want := range map[string]bool{"zeroout": true, "write": true, "none": true, "": false, "discard": false} {
		if IsMethod(s) != want {
			t.Errorf("IsMethod(%q) = %v", s, !want)
		}
	}
}

func TestSignatureRegions(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name string
		size int64
		want [][2]int64
	}{
		{"1 GiB", 1024 * mib, [][2]int64{{0, 4*mib + 4096}, {1022 * mib, 1024 * mib}}},
		{"smaller than the head", 3 * mib, [][2]int64{{0, 3 * mib}}},
		{"the tail overlaps the head", 5 * mib, [][2]int64{{0, 4*mib + 4096}, {4*mib + 4096, 5 * mib}}},
		{"an unaligned size: the tail starts on 4 KiB", 64*mib + 100, [][2]int64{{0, 4*mib + 4096}, {62 * mib, 64*mib + 100}}},
		{"empty", 0, [][2]int64{{0, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SignatureRegions(tc.size)
			if len(got) != len(tc.want) {
				t.Fatalf("SignatureRegions(%d) = %v, want %v", tc.size, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("SignatureRegions(%d) = %v, want %v", tc.size, got, tc.want)
				}
			}
		})
	}
}

// TestDeviceSignaturesZeroesOnlyTheRegions: the head and the tail read as
// zeros afterwards; every other byte is as it was.
func TestDeviceSignaturesZeroesOnlyTheRegions(t *testing.T) {
	const size = 8 << 20
	p := pattern(t, size)
	n, err := Device(context.Background(), p, Signatures)
	if err != nil {
		t.Fatalf("Device(signatures) = %v", err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var zeroed int64
	regions := SignatureRegions(size)
	for i, b := range got {
		in := false
		for _, r := range regions {
			in = in || int64(i) >= r[0] && int64(i) < r[1]
		}
		if in != (b == 0) {
			t.Fatalf("byte %d is %#x after zeroing %v", i, b, regions)
		}
		if in {
			zeroed++
		}
	}
	if n != zeroed {
		t.Errorf("Device(signatures) reported %d bytes, zeroed %d", n, zeroed)
	}
	if IsMethod(string(Signatures)) {
		t.Error("signatures is a method a device class could name")
	}
}

// TestDeviceFlushWritesNothing: Flush leaves the device's bytes as they
// are, answers a missing device with fs.ErrNotExist (the caller tells an
// inactive LV from a failure), and is not a method a class can name. That
// it reaches the disk as a FLUSH is the guest's
// TestZeroingIsFlushedBeforeCreateVolumeAnswers.
func TestDeviceFlushWritesNothing(t *testing.T) {
	p := pattern(t, 8192)
	if n, err := Device(context.Background(), p, Flush); err != nil || n != 0 {
		t.Fatalf("Device(flush) = %d, %v; want 0, nil", n, err)
	}
	if got, _ := os.ReadFile(p); !bytes.Equal(got, bytes.Repeat([]byte{0xA5}, 8192)) {
		t.Fatal("flush changed the device")
	}
	if _, err := Device(context.Background(), filepath.Join(t.TempDir(), "gone"), Flush); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Device(flush) of a missing device = %v, want fs.ErrNotExist", err)
	}
	if IsMethod(string(Flush)) {
		t.Error("flush is a method a device class can name")
	}
}
