//go:build guestinner

package nodeinner

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/test/harness/plugintest"
)

// stage calls NodeStageVolume under a deadline and returns its error.
func (e *env) stage(id string, p paths, capability *csi.VolumeCapability, deadline time.Duration) error {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, err := e.node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: p.staging, VolumeCapability: capability, VolumeContext: e.volumeContext[id],
	})
	return err
}

func (e *env) unstage(id string, p paths) {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	if _, err := e.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p.staging}); err != nil {
		e.t.Fatalf("NodeUnstageVolume %s: %v", id, err)
	}
}

// TestStageOutlivesItsDeadline: a NodeStageVolume whose deadline passes
// while mkfs runs answers ABORTED (what the kubelet retries, keeping the
// staging "uncertain") before its deadline, mkfs is not killed, and the
// retry gets the staged volume, formatted exactly once. The class makes
// ext4 with its inode tables and journal written at mkfs (lazy init off):
// mkfs of 1 GiB took 0.5-1.3 s under TCG, and the call answers at half
// its 250 ms deadline, so the job is still running by a wide margin.
func TestStageOutlivesItsDeadline(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, "stagejob", 1536*mib, `  - name: slowmkfs
    volumeGroup: $VG
    mkfsOptions:
      ext4: ["-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"]
`)
	capability := plugintest.MountCapability("ext4")
	id := e.createWith("stage-outlives", 1024*mib, capability, map[string]string{"carve.dev/device-class": "slowmkfs"})
	p := e.paths("stage-outlives")
	mkfsBefore := e.stepCount("mkfs")

	start := time.Now()
	err := e.stage(id, p, capability, 250*time.Millisecond)
	answered := time.Since(start)
	if status.Code(err) != codes.Aborted {
		if err == nil {
			e.unstage(id, p)
		}
		t.Fatalf("NodeStageVolume under a 250 ms deadline: %v after %s; want ABORTED while mkfs runs", err, answered)
	}
	t.Logf("first stage answered %s after %s", status.Code(err), answered.Round(time.Millisecond))
	if err := e.stage(id, p, capability, rpcTimeout); err != nil {
		t.Fatalf("the retry of NodeStageVolume: %v", err)
	}
	t.Logf("the retry ended %s after the first call", time.Since(start).Round(time.Millisecond))
	if ok, err := plugintest.IsMountPoint(p.staging); err != nil || !ok {
		t.Fatalf("%s is not a mount point after the retry (%v)", p.staging, err)
	}
	// Once more, as the kubelet may: the same staging, no second mkfs.
	if err := e.stage(id, p, capability, rpcTimeout); err != nil {
		t.Fatalf("a repeated NodeStageVolume: %v", err)
	}
	if got := e.stepCount("mkfs") - mkfsBefore; got != 1 {
		t.Errorf("mkfs ran %d times for one volume, want exactly 1", got)
	}
	e.unstage(id, p)
}

// TestDefaultFilesystemsMountOnOldKernels: with the default mkfs options
// the image's tools make filesystems without the features kernels older
// than 5.10 (xfs bigtime, inobtcount), 5.19 (xfs nrext64) and 5.15 (ext4
// orphan_file) cannot mount; a class's own mkfsOptions reach mkfs (an
// empty list gives xfsprogs' defaults, bigtime on).
func TestDefaultFilesystemsMountOnOldKernels(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, "mkfsdefaults", 1536*mib, `  - name: tooldefaults
    volumeGroup: $VG
    mkfsOptions:
      xfs: []
`)
	ctx, cancel := e.ctx()
	defer cancel()
	cases := []struct {
		name, fsType, class string
		size                int64
		// inspect prints the filesystem's features
		inspect       func(dev, staging string) []string
		want, wantNot []string
	}{
		{name: "xfs default", fsType: "xfs", size: 320 * mib,
			inspect: func(_, staging string) []string { return []string{"xfs_info", staging} },
			want:    []string{"bigtime=0", "inobtcount=0", "nrext64=0"}},
		{name: "ext4 default", fsType: "ext4", size: 64 * mib,
			inspect: func(dev, _ string) []string { return []string{"dumpe2fs", "-h", dev} },
			want:    []string{"Filesystem features:"}, wantNot: []string{"orphan_file"}},
		{name: "xfs with the class's empty mkfsOptions", fsType: "xfs", class: "tooldefaults", size: 320 * mib,
			inspect: func(_, staging string) []string { return []string{"xfs_info", staging} },
			want:    []string{"bigtime=1", "inobtcount=1"}},
	}
	for _, tc := range cases {
		name := "mkfs-" + strings.ReplaceAll(tc.name, " ", "-")
		name = strings.ReplaceAll(strings.ReplaceAll(name, "'", ""), "--", "-")
		capability := plugintest.MountCapability(tc.fsType)
		var params map[string]string
		if tc.class != "" {
			params = map[string]string{"carve.dev/device-class": tc.class}
		}
		id := e.createWith(name, tc.size, capability, params)
		dev, err := plugintest.DevicePath(id)
		if err != nil {
			t.Fatal(err)
		}
		p := e.paths(name)
		if err := e.stage(id, p, capability, rpcTimeout); err != nil {
			t.Fatalf("%s: NodeStageVolume: %v", tc.name, err)
		}
		out, err := plugintest.Run(ctx, tc.inspect(dev, p.staging)...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: %q not in:\n%s", tc.name, w, out)
			}
		}
		for _, w := range tc.wantNot {
			if strings.Contains(out, w) {
				t.Errorf("%s: %q in:\n%s", tc.name, w, out)
			}
		}
		e.unstage(id, p)
	}
}
