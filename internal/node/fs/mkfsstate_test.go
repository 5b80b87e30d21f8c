package fs

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/carve-csi/carve/internal/node/fs/fstest"
)

// execOnly hides fstest's ReadHead: ProbeMkfs then reads the file.
type execOnly struct{ utilexec.Interface }

// TestProbeMkfs reads the superblocks the real tools write (their fields
// at their offsets, in a file) and asks e2fsck only about an ext4 never
// mounted: only the remains of an mkfs that did not end are unfinished.
func TestProbeMkfs(t *testing.T) {
	xfs := func(inProgress byte) []byte {
		b := make([]byte, 8192)
		copy(b, "XFSB")
		b[126] = inProgress
		return b
	}
	ext4 := func(mtime uint32, mounts uint16) []byte {
		b := make([]byte, 8192)
		binary.LittleEndian.PutUint16(b[1024+56:], 0xEF53)
		binary.LittleEndian.PutUint32(b[1024+44:], mtime)
		binary.LittleEndian.PutUint16(b[1024+52:], mounts)
		return b
	}
	cases := []struct {
		name     string
		head     []byte
		fsType   string
		e2fsck   error // e2fsck's result
		want     MkfsState
		wantFsck bool
	}{
		{name: "blank xfs", head: make([]byte, 8192), fsType: "xfs", want: NoFilesystem},
		{name: "xfs in progress", head: xfs(1), fsType: "xfs", want: MkfsUnfinished},
		{name: "finished xfs", head: xfs(0), fsType: "xfs", want: MkfsFinished},
		{name: "an xfs where ext4 is asked", head: xfs(0), fsType: "ext4", want: NoFilesystem},
		{name: "ext4 mounted before", head: ext4(1764115200, 3), fsType: "ext4", want: MkfsFinished},
		{name: "ext4 checked since its last mount", head: ext4(1764115200, 0), fsType: "ext4", want: MkfsFinished},
		{name: "ext4 never mounted, checks clean", head: ext4(0, 0), fsType: "ext4", want: MkfsFinished, wantFsck: true},
		{name: "ext4 never mounted, does not check clean", head: ext4(0, 0), fsType: "ext4",
			e2fsck: testingexec.FakeExitError{Status: 4}, want: MkfsUnfinished, wantFsck: true},
		{name: "ext4 never mounted, no e2fsck", head: ext4(0, 0), fsType: "ext4",
			e2fsck: utilexec.ErrExecutableNotFound, want: MkfsFinished, wantFsck: true},
		{name: "btrfs is not read", head: xfs(1), fsType: "btrfs", want: NoFilesystem},
		{name: "a device shorter than a superblock", head: []byte("XFSB"), fsType: "xfs", want: NoFilesystem},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev := filepath.Join(t.TempDir(), "dev")
			if err := os.WriteFile(dev, tc.head, 0o600); err != nil {
				t.Fatal(err)
			}
			tools := fstest.New()
			if tc.e2fsck != nil {
				tools.Fail("e2fsck", tc.e2fsck)
			}
			got, err := New(mount.NewFakeMounter(nil), execOnly{tools}).ProbeMkfs(context.Background(), dev, tc.fsType)
			if err != nil || got != tc.want {
				t.Errorf("ProbeMkfs = %v, %v; want %v", got, err, tc.want)
			}
			if ran := len(tools.Ran("e2fsck")) > 0; ran != tc.wantFsck {
				t.Errorf("e2fsck ran: %v, want %v (%v)", ran, tc.wantFsck, tools.Calls())
			}
		})
	}
	if _, err := New(mount.NewFakeMounter(nil), execOnly{fstest.New()}).ProbeMkfs(context.Background(), filepath.Join(t.TempDir(), "none"), "xfs"); err == nil {
		t.Error("ProbeMkfs of a missing device succeeded")
	}
}
