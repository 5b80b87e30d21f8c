package erase

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// recorder is a target that records its calls in order.
type recorder struct{ calls []string }

func (r *recorder) Name() string { return "/dev/vg1/lv" }

func (r *recorder) WriteAt(b []byte, off int64) (int, error) {
	r.calls = append(r.calls, fmt.Sprintf("write %d+%d", off, len(b)))
	return len(b), nil
}

func (r *recorder) ZeroRange(off, length int64) error {
	r.calls = append(r.calls, fmt.Sprintf("zeroout %d+%d", off, length))
	return nil
}

func (r *recorder) Sync() error {
	r.calls = append(r.calls, "sync")
	return nil
}

// TestZeroingIsSynced: every way of zeroing ends with a sync (of a block
// device, a FLUSH of its write cache) after its last write or BLKZEROOUT,
// so the zeros are durable before the volume is handed out: BLKZEROOUT's
// writes carry no flush (review N3).
func TestZeroingIsSynced(t *testing.T) {
	const size = 2*chunk + 4096
	for _, tc := range []struct {
		name  string
		erase func(f target) error
	}{
		{"zeroout", func(f target) error { return zeroOut(context.Background(), f, size) }},
		{"write", func(f target) error { return write(context.Background(), f, size) }},
		{"signatures of a block device", func(f target) error {
			_, err := zeroSignatures(context.Background(), f, size, true)
			return err
		}},
		{"signatures of a file", func(f target) error {
			_, err := zeroSignatures(context.Background(), f, size, false)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			if err := tc.erase(r); err != nil {
				t.Fatal(err)
			}
			if len(r.calls) < 2 || r.calls[len(r.calls)-1] != "sync" || slices.Index(r.calls, "sync") != len(r.calls)-1 {
				t.Errorf("calls %v; want the zeroing, then one sync last", r.calls)
			}
		})
	}
}
