package driver

import (
	"context"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
)

// shortDeadline stands for the kubelet's 2 minutes: a call under it
// answers before mkfs or fsck, held by the fake, ends.
const shortDeadline = 100 * time.Millisecond

// stageWithin calls NodeStageVolume under a deadline d (0: none) and
// returns its error.
func (fx *nodeFixture) stageWithin(d time.Duration, c *csi.VolumeCapability) error {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	}
	defer cancel()
	_, err := fx.ns.NodeStageVolume(ctx, fx.stageReq(c))
	return err
}

// unstageCode calls NodeUnstageVolume and returns its code.
func (fx *nodeFixture) unstageCode() codes.Code {
	_, err := fx.ns.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: fx.id, StagingTargetPath: fx.staging})
	return status.Code(err)
}

// waitJobEnded waits until the volume's stage job is no longer running.
func (fx *nodeFixture) waitJobEnded(t *testing.T) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); fx.ns.staging.Running(fx.id); {
		if time.Now().After(end) {
			t.Fatal("the stage job did not end")
		}
		time.Sleep(time.Millisecond)
	}
}

// mkfs and fsck that outlast the call's deadline are not killed and
// started again: the call answers ABORTED (the kubelet's "operation
// pending", on which it retries and, if the pod goes, unstages), the work
// runs to its end, and a retry with the same arguments joins it or gets
// its result.
func TestStageOutlivesItsDeadline(t *testing.T) {
	ext4 := mountCap("ext4", sw)
	cases := []struct {
		name string
		// held is the command that outlasts the deadline; existing the
		// filesystem already on the device.
		held, existing string
		run            func(t *testing.T, fx *nodeFixture, release func())
		// mkfs and fsck are how often each must have run in all.
		mkfs, fsck int
	}{
		{name: "mkfs: the retry joins the running job", held: "mkfs.ext4", mkfs: 1,
			run: func(t *testing.T, fx *nodeFixture, release func()) {
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.Aborted)
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.Aborted)
				time.AfterFunc(shortDeadline, release)
				csitest.WantCode(t, fx.stageWithin(0, ext4), codes.OK)
			}},
		{name: "fsck: the retry joins the running job", held: "fsck", existing: "ext4", fsck: 1,
			run: func(t *testing.T, fx *nodeFixture, release func()) {
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.Aborted)
				release()
				csitest.WantCode(t, fx.stageWithin(0, ext4), codes.OK)
			}},
		{name: "a retry after the job ended gets its result", held: "mkfs.ext4", mkfs: 1,
			run: func(t *testing.T, fx *nodeFixture, release func()) {
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.Aborted)
				release()
				fx.waitJobEnded(t)
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.OK)
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.OK)
			}},
		{name: "a failed job's error reaches the retry once, then the work starts afresh", held: "mkfs.ext4", mkfs: 2,
			run: func(t *testing.T, fx *nodeFixture, release func()) {
				fx.tools.FailIf(func(argv []string) bool { return argv[0] == "mkfs.ext4" }, testingexec.FakeExitError{Status: 1})
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.Aborted)
				release()
				fx.waitJobEnded(t)
				csitest.WantCode(t, fx.stageWithin(0, ext4), codes.Internal, "format")
				csitest.WantCode(t, fx.stageWithin(0, ext4), codes.Internal)
			}},
		{name: "unstage while the job runs is ABORTED and leaves the stage whole", held: "mkfs.ext4", mkfs: 1,
			run: func(t *testing.T, fx *nodeFixture, release func()) {
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.Aborted)
				if got := fx.unstageCode(); got != codes.Aborted {
					t.Fatalf("unstage during mkfs: %s, want Aborted", got)
				}
				release()
				csitest.WantCode(t, fx.stageWithin(0, ext4), codes.OK)
				if got := fx.unstageCode(); got != codes.OK {
					t.Fatalf("unstage after the stage: %s", got)
				}
				fx.wantGone(t, fx.staging, "staging path")
			}},
		{name: "a stage with other arguments while the job runs is ABORTED", held: "mkfs.ext4", mkfs: 1,
			run: func(t *testing.T, fx *nodeFixture, release func()) {
				csitest.WantCode(t, fx.stageWithin(shortDeadline, ext4), codes.Aborted)
				csitest.WantCode(t, fx.stageWithin(0, mountCap("xfs", sw)), codes.Aborted, "other arguments")
				release()
				csitest.WantCode(t, fx.stageWithin(0, ext4), codes.OK)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			if tc.existing != "" {
				fx.tools.SetFormat(fx.device, tc.existing)
			}
			release := fx.tools.Hold(tc.held)
			defer release()
			tc.run(t, fx, release)
			fx.waitJobEnded(t)
			if got := len(fx.tools.Ran("mkfs.ext4")); got != tc.mkfs {
				t.Errorf("mkfs.ext4 ran %d times, want %d", got, tc.mkfs)
			}
			if got := len(fx.tools.Ran("fsck")); got != tc.fsck {
				t.Errorf("fsck ran %d times, want %d", got, tc.fsck)
			}
			// Nothing was killed: every command's context was live.
			for i, err := range fx.tools.ContextErrors() {
				if err != nil {
					t.Errorf("%v ran under an ended context: %v", fx.tools.Calls()[i], err)
				}
			}
			mounts := 0
			for _, a := range fx.mounter.GetLog() {
				if a.Action == mount.FakeActionMount {
					mounts++
				}
			}
			if mounts > 1 {
				t.Errorf("mounted %d times, want at most once: %v", mounts, fx.mounter.GetLog())
			}
		})
	}
}
