//go:build guestinner

package nodeinner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/test/harness/plugintest"
)

// hungMount mounts at dir a FUSE filesystem whose daemon never answers: any
// stat of dir blocks, as on a hard NFS mount whose server is gone. It
// returns a function that ends it (the connection is aborted, so blocked
// calls fail with ENOTCONN) and unmounts it.
func hungMount(t *testing.T, dir string) (end func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := plugintest.Run(ctx, "modprobe", "fuse"); err != nil {
		t.Fatalf("modprobe fuse: %v", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/fuse: %v", err)
	}
	// Nothing ever reads fd: the kernel's requests (FUSE_INIT, then a
	// GETATTR for any stat) wait for good.
	if err := syscall.Mount("hung", dir, "fuse", syscall.MS_NOSUID|syscall.MS_NODEV,
		fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)); err != nil {
		_ = syscall.Close(fd)
		t.Fatalf("mounting a FUSE filesystem at %s: %v", dir, err)
	}
	return func() {
		if err := syscall.Close(fd); err != nil {
			t.Errorf("closing /dev/fuse: %v", err)
		}
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	}
}

// TestHungMountOfAnotherPod: another pod's mount whose stat hangs (a FUSE
// mount with no daemon, as an NFS mount of a dead server) sits in the mount
// table after carve's mounts. Every carve call on its own volumes still
// answers: a repeated publish, a second publish of a single-writer
// filesystem and of a single-writer raw-block volume (refused, which reads
// every mount of the device), volume stats, unpublish and unstage.
func TestHungMountOfAnotherPod(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "hungmount", 512*mib)
	ssw := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER}
	fsCap := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}, AccessMode: ssw}
	blockCap := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: ssw}
	fsID, blockID := e.create("hung-fs", 64*mib, fsCap), e.create("hung-block", 64*mib, blockCap)
	fsPaths, blockPaths := e.paths("hung-fs"), e.paths("hung-block")
	e.stagePublish(fsID, fsPaths, fsCap)
	// A raw-block volume: nothing is mounted at its staging path.
	if err := e.stage(blockID, blockPaths, blockCap, rpcTimeout); err != nil {
		t.Fatalf("NodeStageVolume of the raw-block volume: %v", err)
	}
	pctx, pcancel := e.ctx()
	defer pcancel()
	if _, err := e.node().NodePublishVolume(pctx, &csi.NodePublishVolumeRequest{
		VolumeId: blockID, StagingTargetPath: blockPaths.staging, TargetPath: blockPaths.target, VolumeCapability: blockCap,
		VolumeContext: e.volumeContext[blockID]}); err != nil {
		t.Fatalf("NodePublishVolume of the raw-block volume: %v", err)
	}

	end := hungMount(t, filepath.Join(e.dir, "pods", "other-pod", "nfs"))
	ended := false
	defer func() {
		if !ended {
			end()
		}
	}()
	// The mount must really hang a stat, or this test proves nothing.
	statDone := make(chan error, 1)
	go func() {
		_, err := os.Stat(filepath.Join(e.dir, "pods", "other-pod", "nfs"))
		statDone <- err
	}()
	select {
	case err := <-statDone:
		t.Fatalf("a stat of the FUSE mount returned (%v): it does not hang, so the test proves nothing", err)
	case <-time.After(2 * time.Second):
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		name string
		id   string
		p    paths
		cap  *csi.VolumeCapability
	}{{"filesystem", fsID, fsPaths, fsCap}, {"raw block", blockID, blockPaths, blockCap}} {
		publish := func(target string) error {
			_, err := e.node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
				VolumeId: c.id, StagingTargetPath: c.p.staging, TargetPath: target, VolumeCapability: c.cap,
				VolumeContext: e.volumeContext[c.id]})
			return err
		}
		if err := publish(c.p.target); err != nil {
			t.Errorf("%s: repeated NodePublishVolume: %v", c.name, err)
		}
		if err := publish(c.p.target + "-second"); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: a second publish of a single-writer volume: %v, want FAILED_PRECONDITION (already published)", c.name, err)
		}
		if _, err := e.node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: c.id, VolumePath: c.p.target}); err != nil {
			t.Errorf("%s: NodeGetVolumeStats: %v", c.name, err)
		}
		if _, err := e.node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: c.id, TargetPath: c.p.target}); err != nil {
			t.Errorf("%s: NodeUnpublishVolume: %v", c.name, err)
		}
		if _, err := e.node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: c.id, StagingTargetPath: c.p.staging}); err != nil {
			t.Errorf("%s: NodeUnstageVolume: %v", c.name, err)
		}
	}
	end()
	ended = true
	select {
	case err := <-statDone:
		if err == nil {
			t.Error("the blocked stat succeeded after the FUSE connection was aborted; want an error (ENOTCONN)")
		}
	case <-time.After(10 * time.Second):
		t.Error("the blocked stat did not return after the FUSE connection was aborted")
	}
}
