package fs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	mount "k8s.io/mount-utils"

	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs/fstest"
)

const testMiB = 1 << 20

// device writes a sparse file of size bytes with a non-zero byte at each
// of marks, standing in for a block device.
func device(t *testing.T, size int64, marks ...int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dev")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, m := range marks {
		if _, err := f.WriteAt([]byte{0x53}, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadsBlank(t *testing.T) {
	const size = 64 * testMiB
	for _, tc := range []struct {
		name  string
		size  int64
		marks []int64
		want  bool
	}{
		{name: "all zeros", size: size, want: true},
		{name: "ext4's superblock at 1 KiB", size: size, marks: []int64{1024 + 0x38}, want: false},
		{name: "the LVM label at 512 B", size: size, marks: []int64{512}, want: false},
		{name: "btrfs's superblock at 64 KiB", size: size, marks: []int64{64*1024 + 0x40}, want: false},
		{name: "the first byte", size: size, marks: []int64{0}, want: false},
		{name: "VMFS at 2 MiB", size: size, marks: []int64{2 * testMiB}, want: false},
		{name: "LUKS2's last secondary header at 4 MiB", size: size, marks: []int64{4*testMiB + 4095}, want: false},
		{name: "the last byte (GPT backup, md 1.0)", size: size, marks: []int64{size - 1}, want: false},
		{name: "md 0.90 at 64 KiB from the end", size: size, marks: []int64{size - 64*1024}, want: false},
		{name: "Promise's 3087 sectors from the end", size: size, marks: []int64{size - 3087*512}, want: false},
		// Where no tool looks, data does not count: a device is blank by
		// its signature regions, as blkid judges it.
		{name: "data past the head only", size: size, marks: []int64{4*testMiB + 4096}, want: true},
		{name: "data in the middle only", size: size, marks: []int64{size / 2}, want: true},
		{name: "data just before the tail only", size: size, marks: []int64{size - 2*testMiB - 1}, want: true},
		{name: "a device smaller than both regions, all zeros", size: 3 * testMiB / 2, want: true},
		{name: "a device smaller than both regions, data in its middle", size: 3 * testMiB / 2, marks: []int64{testMiB}, want: false},
		{name: "a device between head and head+tail, data at its end", size: 5 * testMiB, marks: []int64{5*testMiB - 1}, want: false},
		{name: "a size that is not a multiple of 4 KiB, data at its end", size: size + 100, marks: []int64{size + 99}, want: false},
		{name: "a size that is not a multiple of 4 KiB, all zeros", size: size + 100, want: true},
		{name: "an empty device", size: 0, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadsBlank(device(t, tc.size, tc.marks...))
			if err != nil || got != tc.want {
				t.Errorf("ReadsBlank = %t, %v; want %t, nil", got, err, tc.want)
			}
		})
	}
	// What CreateVolume zeroes on a new volume is what is read here: a
	// device full of data, once erased so, reads as blank.
	full := filepath.Join(t.TempDir(), "full")
	if err := os.WriteFile(full, bytes.Repeat([]byte{0xA5}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if blank, err := ReadsBlank(full); err != nil || blank {
		t.Fatalf("ReadsBlank of a full device = %t, %v; want false", blank, err)
	}
	if _, err := erase.Device(context.Background(), full, erase.Signatures); err != nil {
		t.Fatal(err)
	}
	if blank, err := ReadsBlank(full); err != nil || !blank {
		t.Errorf("ReadsBlank after erase.Signatures = %t, %v; want true", blank, err)
	}
	if got, err := ReadsBlank(filepath.Join(t.TempDir(), "missing")); err == nil || got {
		t.Errorf("ReadsBlank of a missing device = %t, %v; want false and an error", got, err)
	}
}

// TestFormatAndMountReadsBlankDevices: a device that reads as zeros is
// formatted without any blkid; one with anything else on it goes to blkid,
// which decides as before: a signature is never formatted, leftover data
// without one is.
func TestFormatAndMountReadsBlankDevices(t *testing.T) {
	for _, tc := range []struct {
		name      string
		marks     []int64
		format    string // what the fake blkid finds
		readOnly  bool
		wantBlank bool
		wantBlkid int
		wantMkfs  bool
		wantErr   bool
	}{
		{name: "zeros: mkfs, no blkid", wantBlank: true, wantMkfs: true},
		{name: "a filesystem: blkid, no mkfs", marks: []int64{1024 + 0x38}, format: "ext4", wantBlkid: 1},
		{name: "a signature at the end: blkid, no mkfs", marks: []int64{8*testMiB - 1}, format: "linux_raid_member", wantBlkid: 1, wantErr: true},
		{name: "leftover data blkid names nothing in: blkid, then mkfs", marks: []int64{8192}, wantBlkid: 1, wantMkfs: true},
		{name: "zeros, read-only: refused", readOnly: true, wantBlank: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := device(t, 8*testMiB, tc.marks...)
			tools := fstest.New()
			if tc.format != "" {
				tools.SetFormat(dev, tc.format)
			}
			m := mount.NewFakeMounter(nil)
			res, err := New(m, tools).FormatAndMount(testCtx(), dev, t.TempDir(), "ext4", nil, nil, func(existing string) error {
				if existing != "" && existing != "ext4" {
					return errors.New("another filesystem")
				}
				if existing == "" && tc.readOnly {
					return errors.New("blank and read-only")
				}
				return nil
			})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %t", err, tc.wantErr)
			}
			if res.Blank != tc.wantBlank || !res.Probed {
				t.Errorf("result %+v, want blank %t and probed", res, tc.wantBlank)
			}
			if n := len(tools.Ran("blkid")); n != tc.wantBlkid {
				t.Errorf("blkid ran %d times, want %d", n, tc.wantBlkid)
			}
			mkfs := tools.Ran("mkfs.ext4")
			if tc.wantMkfs != (len(mkfs) == 1) || len(mkfs) > 1 || res.Formatted != tc.wantMkfs {
				t.Errorf("mkfs runs %v (formatted %t), want one: %t", mkfs, res.Formatted, tc.wantMkfs)
			}
			if len(mkfs) == 1 && !slices.Equal(mkfs[0], []string{"mkfs.ext4", "-F", "-m0", dev}) {
				t.Errorf("mkfs ran as %v", mkfs[0])
			}
			everyCommandHadContext(t, tools)
		})
	}
}

// TestBlankAnswer: a device that reads blank is formatted with no blkid
// at all, and that answer lasts one call: once the device holds a
// filesystem, the next call reads it with blkid and formats nothing.
func TestBlankAnswer(t *testing.T) {
	dev := device(t, 8*testMiB)
	tools := fstest.New()
	f := New(mount.NewFakeMounter(nil), tools)
	stage := func() FormatResult {
		t.Helper()
		res, err := f.FormatAndMount(testCtx(), dev, t.TempDir(), "ext4", nil, nil, func(string) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := stage(); !res.Blank || !res.Formatted || len(tools.Ran("blkid")) != 0 {
		t.Errorf("blank device: result %+v, blkid %v; want formatted without blkid", res, tools.Ran("blkid"))
	}
	// What mkfs would have written at the ext4 superblock's magic.
	mark(t, dev, 1024+0x38)
	if res := stage(); res.Blank || res.Formatted || len(tools.Ran("blkid")) != 1 || len(tools.Ran("mkfs.ext4")) != 1 {
		t.Errorf("formatted device: result %+v, blkid %v, mkfs %v; want one blkid and no second mkfs", res, tools.Ran("blkid"), tools.Ran("mkfs.ext4"))
	}
	everyCommandHadContext(t, tools)
}

// mark writes a non-zero byte into device at off.
func mark(t *testing.T, device string, off int64) {
	t.Helper()
	f, err := os.OpenFile(device, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0x53}, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
