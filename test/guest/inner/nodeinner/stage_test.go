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

// stageDeadline is the first call's deadline in
// TestStageOutlivesItsDeadline. carve answers ABORTED a margin before it
// (at most 5 s: 15 s here), whatever the machine's load; only its own
// work before it starts waiting (reading and activating the LV, checking
// the staging path: well under a second) could push the answer past it,
// and taking 20 s for that would be a defect worth failing on.
const stageDeadline = 20 * time.Second

// TestStageOutlivesItsDeadline: a NodeStageVolume whose deadline passes
// while mkfs runs answers ABORTED (what the kubelet retries, keeping the
// staging "uncertain") before its deadline, mkfs is not killed, and the
// retry gets the staged volume, formatted exactly once.
//
// mkfs is held (heldMkfs) until the first call has answered, so the
// verdict does not hang on how fast the guest is: a stage that waited
// for its job to the end would get DeadlineExceeded, one that answered
// without waiting would answer before half its deadline, and one whose
// mkfs died with the call would run mkfs again on the retry or fail it.
func TestStageOutlivesItsDeadline(t *testing.T) {
	t.Parallel()
	mkfs := newHeldMkfs(t)
	e := newEnvFor(t, "stagejob", 512*mib, "", mkfs.env())
	// Before the plugin stops, so that a failed test leaves no mkfs held.
	t.Cleanup(mkfs.release)
	capability := plugintest.MountCapability("ext4")
	id := e.create("stage-outlives", 64*mib, capability)
	p := e.paths("stage-outlives")
	mkfsBefore := e.stepCount("mkfs")

	start := time.Now()
	err := e.stage(id, p, capability, stageDeadline)
	answered := time.Since(start)
	if status.Code(err) != codes.Aborted {
		mkfs.release()
		if err == nil {
			e.unstage(id, p)
		}
		t.Fatalf("NodeStageVolume under a %s deadline: %v after %s; want ABORTED while mkfs runs", stageDeadline, err, answered)
	}
	t.Logf("first stage answered %s after %s", status.Code(err), answered.Round(time.Millisecond))
	// The wait for the job ends half the time left before the deadline
	// at the earliest (jobs.AnswerBy): timers do not fire early.
	if answered < stageDeadline/2 {
		t.Errorf("the first stage answered after %s, before half its %s deadline: it did not wait for its mkfs", answered, stageDeadline)
	}
	if got := mkfs.runs(); got != 1 {
		t.Fatalf("mkfs.ext4 started %d times before the first stage answered, want 1", got)
	}
	mkfs.release()
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
	if got := mkfs.runs(); got != 1 {
		t.Errorf("mkfs.ext4 started %d times for one volume, want exactly 1", got)
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
		dev := plugintest.MustDevicePath(t, id)
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
