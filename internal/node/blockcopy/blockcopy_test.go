package blockcopy

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// files makes a source of srcSize random bytes and a target of dstSize
// bytes of 0xEE (an earlier tenant's data), and returns their paths and
// the source's bytes.
func files(t *testing.T, srcSize, dstSize int) (src, dst string, data []byte) {
	t.Helper()
	dir := t.TempDir()
	data = make([]byte, srcSize)
	rand.New(rand.NewSource(int64(srcSize))).Read(data)
	// Whole zero blocks in the middle: they must be written too.
	if srcSize >= 3*align {
		clear(data[align : 2*align])
	}
	src, dst = filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, bytes.Repeat([]byte{0xEE}, dstSize), 0o600); err != nil {
		t.Fatal(err)
	}
	return src, dst, data
}

func TestCopy(t *testing.T) {
	tests := []struct {
		name             string
		srcSize, dstSize int
		size             uint64
		opts             Options
	}{
		{"one chunk", 64 << 10, 64 << 10, 64 << 10, Options{}},
		{"many chunks, last one short", 10*align + 512, 16 * align, 10*align + 512, Options{BufferSize: 3 * align}},
		{"direct", 32 * align, 32 * align, 32 * align, Options{Direct: true, BufferSize: 4 * align}},
		{"larger target: its tail is zeroed", 8 * align, 12 * align, 8 * align, Options{BufferSize: align}},
		{"nothing copied: the whole target is zeroed", align, align, 0, Options{}},
		// Extents under 4 KiB (vgcreate -s 1k): sizes O_DIRECT cannot
		// write; the copy is buffered (it was refused).
		{"direct, size not a multiple of 4 KiB", 4*align + 1024, 4*align + 1024, 4*align + 1024, Options{Direct: true, BufferSize: 2 * align}},
		{"direct, target's tail not a multiple of 4 KiB", 4 * align, 6*align + 512, 4 * align, Options{Direct: true, BufferSize: 2 * align}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst, data := files(t, tt.srcSize, tt.dstSize)
			var progress []uint64
			tt.opts.Progress = func(n uint64) { progress = append(progress, n) }
			res, err := Copy(context.Background(), dst, src, tt.size, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if res.Bytes != tt.size {
				t.Errorf("copied %d bytes, want %d", res.Bytes, tt.size)
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:tt.size], data[:tt.size]) {
				t.Error("the target's copied range differs from the source")
			}
			// What lies past the copy is an earlier tenant's: never shown.
			if tail := got[tt.size:]; !bytes.Equal(tail, make([]byte, len(tail))) {
				t.Error("the target past the copy is not all zeros")
			}
			if res.Zeroed != uint64(tt.dstSize)-tt.size {
				t.Errorf("zeroed %d bytes past the copy, want %d", res.Zeroed, uint64(tt.dstSize)-tt.size)
			}
			if len(progress) > 0 && progress[len(progress)-1] != tt.size {
				t.Errorf("progress ended at %d, want %d", progress[len(progress)-1], tt.size)
			}
		})
	}
}

func TestCopyFails(t *testing.T) {
	tests := []struct {
		name    string
		size    uint64
		opts    Options
		cancel  bool
		wantIs  error
		noWrite bool
	}{
		{"source too short", 16 * align, Options{}, false, ErrShortSource, false},
		{"bad buffer size", 4 * align, Options{BufferSize: 1000}, false, nil, true},
		{"context ended", 4 * align, Options{}, true, context.Canceled, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst, _ := files(t, 8*align, 16*align)
			ctx, cancel := context.WithCancel(context.Background())
			if tt.cancel {
				cancel()
			}
			defer cancel()
			res, err := Copy(ctx, dst, src, tt.size, tt.opts)
			if err == nil {
				t.Fatal("Copy succeeded")
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("error %v, want %v", err, tt.wantIs)
			}
			if tt.noWrite && res.Bytes != 0 {
				t.Errorf("wrote %d bytes before failing", res.Bytes)
			}
		})
	}
	if _, err := Copy(context.Background(), "/nonexistent/dst", "/nonexistent/src", align, Options{}); err == nil {
		t.Error("Copy of missing files succeeded")
	}
}

// TestCopySparse: a sparse copy into a new (all-hole) target writes only
// the SparseChunk chunks of the source that hold data, each whole, and
// leaves the rest of the target (zero chunks, the tail) unwritten: the
// file's allocated blocks are those of the data chunks.
func TestCopySparse(t *testing.T) {
	const chunk = SparseChunk
	tests := []struct {
		name string
		// data marks the source's chunks that hold data; the last may
		// be short (tail bytes).
		data     []bool
		tail     int
		dstSize  int
		bufSize  int
		wantSkip uint64
	}{
		{"all zeros", []bool{false, false, false}, 0, 4 * chunk, 2 * chunk, 3 * chunk},
		{"data in a zero buffer's middle", []bool{false, true, false, false}, 0, 8 * chunk, 4 * chunk, 3 * chunk},
		{"runs across buffers", []bool{true, true, false, true, true, true, false, false}, 0, 8 * chunk, 2 * chunk, 3 * chunk},
		{"short last chunk with data", []bool{false, true}, align, 4 * chunk, 4 * chunk, chunk},
		{"short last chunk of zeros", []bool{true, false}, align, 4 * chunk, 4 * chunk, align},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			size := len(tt.data) * chunk
			if tt.tail > 0 {
				size = (len(tt.data)-1)*chunk + tt.tail
			}
			data := make([]byte, size)
			rng := rand.New(rand.NewSource(int64(size)))
			var dataChunks int64
			for i, has := range tt.data {
				if has {
					part := data[i*chunk : min((i+1)*chunk, size)]
					rng.Read(part)
					// Zeros inside a chunk with data are written with it.
					clear(part[:len(part)/2])
					dataChunks++
				}
			}
			dir := t.TempDir()
			src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
			if err := os.WriteFile(src, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(dst, int64(tt.dstSize)); err != nil {
				t.Fatal(err)
			}
			res, err := Copy(context.Background(), dst, src, uint64(size), Options{Sparse: true, BufferSize: tt.bufSize})
			if err != nil {
				t.Fatal(err)
			}
			if res.Bytes != uint64(size) || res.Skipped != tt.wantSkip || res.Zeroed != 0 {
				t.Errorf("result %+v, want %d bytes, %d skipped, 0 zeroed", res, size, tt.wantSkip)
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:size], data) {
				t.Error("the target's copied range differs from the source")
			}
			if tail := got[size:]; !bytes.Equal(tail, make([]byte, len(tail))) {
				t.Error("the target past the copy is not all zeros")
			}
			var st syscall.Stat_t
			if err := syscall.Stat(dst, &st); err != nil {
				t.Fatal(err)
			}
			// Allocation can be coarser than a chunk; never more than
			// the data chunks and one filesystem block on each side.
			if used, limit := st.Blocks*512, dataChunks*chunk+2*st.Blksize; used > limit {
				t.Errorf("the target has %d bytes allocated for %d chunks with data: zeros were written", used, dataChunks)
			}
		})
	}
}

func TestCopySparseBufferSize(t *testing.T) {
	src, dst, _ := files(t, align, align)
	if _, err := Copy(context.Background(), dst, src, align, Options{Sparse: true, BufferSize: 3 * align}); err == nil {
		t.Error("a sparse copy accepted a buffer that is not a whole number of chunks")
	}
}
