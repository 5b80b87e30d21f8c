package driver

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	mount "k8s.io/mount-utils"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/fs"
)

// Staging mounts carry nodev,nosuid after the capability's flags (so that
// none undoes them), and a SINGLE_NODE_READER_ONLY volume is staged
// read-only: never formatted, never fsck-repaired.
func TestStagingMountOptions(t *testing.T) {
	stageCase := func(c *csi.VolumeCapability) func(fx *nodeFixture) *csi.NodeStageVolumeRequest {
		return func(fx *nodeFixture) *csi.NodeStageVolumeRequest { return fx.stageReq(c) }
	}
	formatted := func(t *testing.T, fx *nodeFixture) { fx.tools.SetFormat(fx.device, "ext4") }
	opts := func(fx *nodeFixture) []string {
		if mp := fx.mountAt(fx.staging); mp != nil {
			return mp.Opts
		}
		return nil
	}
	cases := []nodeCase[*csi.NodeStageVolumeRequest]{
		{name: "nodev,nosuid after the flags", req: stageCase(withFlags(mountCap("", sw), "defaults", "noatime")),
			check: func(t *testing.T, fx *nodeFixture) {
				// mount-utils appends its own "defaults", which libmount
				// takes as no option at all.
				if got := opts(fx); len(got) < 4 || !slices.Equal(got[:4], []string{"defaults", "noatime", "nodev", "nosuid"}) {
					t.Errorf("staging mount options %v, want the flags then nodev, nosuid", got)
				}
			}},
		{name: "suid refused", code: codes.InvalidArgument, msg: []string{"mount_flags[0]", "nodev,nosuid"},
			req: stageCase(withFlags(mountCap("", sw), "suid"))},
		{name: "dev refused", code: codes.InvalidArgument, msg: []string{"mount_flags[1]"},
			req: stageCase(withFlags(mountCap("", sw), "noatime", "dev"))},
		{name: "reader-only: staged read-only without fsck", prepare: formatted, req: stageCase(mountCap("ext4", ro)),
			check: func(t *testing.T, fx *nodeFixture) {
				if got := opts(fx); !slices.Contains(got, "ro") {
					t.Errorf("staging mount options %v, want ro", got)
				}
				if n := len(fx.tools.Ran("fsck")); n != 0 {
					t.Errorf("fsck ran %d times on a read-only volume", n)
				}
			}},
		{name: "writer: fsck runs (what the reader case is compared with)", prepare: formatted, req: stageCase(mountCap("ext4", sw)),
			check: func(t *testing.T, fx *nodeFixture) {
				if slices.Contains(opts(fx), "ro") || len(fx.tools.Ran("fsck")) == 0 {
					t.Errorf("options %v, fsck %v", opts(fx), fx.tools.Ran("fsck"))
				}
			}},
		{name: "reader-only of a blank device: not formatted", code: codes.FailedPrecondition, msg: []string{"does not format it for a reader"},
			req: stageCase(mountCap("ext4", ro)),
			check: func(t *testing.T, fx *nodeFixture) {
				if len(fx.tools.Ran("mkfs.ext4")) != 0 || fx.mountAt(fx.staging) != nil {
					t.Error("a blank reader-only volume was formatted or mounted")
				}
			}},
		{name: "reader-only with rw in the flags", code: codes.InvalidArgument, msg: []string{`"rw"`, "SINGLE_NODE_READER_ONLY"},
			req: stageCase(withFlags(mountCap("", ro), "rw"))},
		{name: "staged again with the same flags", prepare: func(t *testing.T, fx *nodeFixture) {
			fx.stage(t, withFlags(mountCap("", sw), "noatime"))
		}, req: stageCase(withFlags(mountCap("", sw), "noatime"))},
		{name: "staged again with other flags", code: codes.AlreadyExists, msg: []string{`"noatime"`},
			prepare: func(t *testing.T, fx *nodeFixture) { fx.stage(t, withFlags(mountCap("", sw), "noatime")) },
			req:     stageCase(mountCap("", sw))},
		{name: "staged again read-only over a writer's mount", code: codes.AlreadyExists, msg: []string{`"ro"`},
			prepare: func(t *testing.T, fx *nodeFixture) { fx.stage(t, mountCap("", sw)) },
			req:     stageCase(mountCap("", ro))},
	}
	runNodeCases(t, cases, nodeRPC[*csi.NodeStageVolumeRequest]{call: callNode((*NodeServer).NodeStageVolume)})
}

// Publish: ro/rw in the flags that contradict readonly are refused, "ro"
// in the flags makes the mount read-only (and a repeat is OK), a repeat
// with other flags is AlreadyExists.
func TestPublishMountOptions(t *testing.T) {
	staged := func(t *testing.T, fx *nodeFixture) { fx.stage(t, mountCap("", sw)) }
	publishCase := func(c *csi.VolumeCapability, readOnly bool) func(fx *nodeFixture) *csi.NodePublishVolumeRequest {
		return func(fx *nodeFixture) *csi.NodePublishVolumeRequest { return fx.publishReq(c, readOnly) }
	}
	cases := []nodeCase[*csi.NodePublishVolumeRequest]{
		{name: "rw with readonly", code: codes.InvalidArgument, msg: []string{`"rw"`, "readonly"}, prepare: staged,
			req: publishCase(withFlags(mountCap("", sw), "rw"), true)},
		{name: "rw with a reader-only mode", code: codes.InvalidArgument, msg: []string{`"rw"`}, prepare: staged,
			req: publishCase(withFlags(mountCap("", ro), "rw"), false)},
		{name: "ro in the flags: read-only, ro last", prepare: staged,
			req: publishCase(withFlags(mountCap("", sw), "ro", "noatime"), false),
			check: func(t *testing.T, fx *nodeFixture) {
				if mp := fx.mountAt(fx.target); mp == nil || !slices.Equal(mp.Opts, []string{"bind", "noatime", "ro"}) {
					t.Errorf("publish mount %+v, want options bind, noatime, ro", mp)
				}
			}},
		{name: "readonly: ro last, after the flags", prepare: staged,
			req: publishCase(withFlags(mountCap("", sw), "noatime"), true),
			check: func(t *testing.T, fx *nodeFixture) {
				if mp := fx.mountAt(fx.target); mp == nil || !slices.Equal(mp.Opts, []string{"bind", "noatime", "ro"}) {
					t.Errorf("publish mount %+v, want options bind, noatime, ro", mp)
				}
			}},
	}
	// Each case twice: the repeat of a publish with the same arguments is OK.
	runNodeCases(t, cases, nodeRPC[*csi.NodePublishVolumeRequest]{call: callNode((*NodeServer).NodePublishVolume), times: 2})

	again := []nodeCase[*csi.NodePublishVolumeRequest]{
		{name: "published again with other flags", code: codes.AlreadyExists, msg: []string{`"noatime"`},
			prepare: func(t *testing.T, fx *nodeFixture) {
				staged(t, fx)
				fx.publish(t, withFlags(mountCap("", sw), "noatime"), false)
			}, req: publishCase(mountCap("", sw), false)},
		{name: "published again with noexec added", code: codes.AlreadyExists, msg: []string{`"noexec"`},
			prepare: func(t *testing.T, fx *nodeFixture) {
				staged(t, fx)
				fx.publish(t, mountCap("", sw), false)
			}, req: publishCase(withFlags(mountCap("", sw), "noexec"), false)},
	}
	runNodeCases(t, again, nodeRPC[*csi.NodePublishVolumeRequest]{call: callNode((*NodeServer).NodePublishVolume)})
}

// halfMounter mounts, then fails, as a bind mount whose read-only remount
// failed (or whose request ended between the two steps) does.
type halfMounter struct{ *mount.FakeMounter }

func (h halfMounter) Mount(source, target, fsType string, options []string) error {
	if err := h.FakeMounter.Mount(source, target, fsType, options); err != nil {
		return err
	}
	return errors.New("mount -o bind,remount,ro: exit status 32")
}

// A publish that fails half-way leaves nothing mounted at the target, so
// the kubelet's retry publishes afresh instead of finding a read-write
// mount and answering ALREADY_EXISTS forever.
func TestPublishFailingHalfWayLeavesNothingMounted(t *testing.T) {
	fx := newNodeFixture(t)
	fx.stage(t, mountCap("", sw))
	cfg := fx.ns.cfg
	cfg.FS = fs.New(halfMounter{fx.mounter}, fx.tools)
	half := NewNodeServer(cfg)
	_, err := half.NodePublishVolume(context.Background(), fx.publishReq(mountCap("", sw), true))
	csitest.WantCode(t, err, codes.Internal, "undone")
	if fx.mountAt(fx.target) != nil {
		t.Fatal("the half-made publish mount was left at the target")
	}
	// The retry, on a working mounter, publishes read-only.
	fx.publish(t, mountCap("", sw), true)
	if mp := fx.mountAt(fx.target); mp == nil || !slices.Contains(mp.Opts, "ro") {
		t.Errorf("publish after the failure: %+v", mp)
	}
	if mp := fx.mountAt(fx.staging); mp == nil {
		t.Error("the undo unmounted the staging path")
	}
}
