package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/volume"
)

// TestStageRemakesAFilesystemWhoseMkfsNeverEnded: a stage marks the
// volume, naming its LV (UUID), before mkfs and takes the mark off before
// it answers. A mark found at the next stage is a hint that an mkfs never
// ended (the plugin's container killed with it, or the node down), never
// enough to destroy anything: the device decides. The remains of an
// unfinished mkfs (an xfs flagged in progress, an ext4 never mounted that
// does not check clean) are zeroed and the filesystem made again; a
// finished filesystem is kept and mounted, the mark dropped (a stale mark:
// a state directory restored from an older copy); another filesystem is
// refused as ever; a mark naming an earlier LV of that name is dropped.
// Without a mark, a signature is treated as ever: mounted when it is the
// asked filesystem, refused when it is another.
func TestStageRemakesAFilesystemWhoseMkfsNeverEnded(t *testing.T) {
	const earlierLV = "000099-fake-uuid-0000-0000-0000-000000"
	tests := []struct {
		name    string
		fsType  string // the capability's; "" is ext4
		mark    string // "": none; "plain": a mark naming no LV; "own": naming the LV; else that UUID
		remains string // the signature on the device ("" blank)
		// unfinished makes remains an unfinished mkfs's, mounted a
		// filesystem a read-write mount held.
		unfinished, mounted bool
		failMkfs            bool
		code                codes.Code
		wantWiped           bool
		wantMkfs            int
		wantMarked          bool // after the stage
	}{
		{name: "blank device", wantMkfs: 1},
		{name: "mkfs failed: the mark stays for the retry", failMkfs: true, code: codes.Internal, wantMkfs: 1, wantMarked: true},
		{name: "remains of a killed mkfs.ext4", mark: "plain", remains: "ext4", unfinished: true, wantWiped: true, wantMkfs: 1},
		{name: "remains of a killed mkfs.xfs", fsType: "xfs", mark: "own", remains: "xfs", unfinished: true, wantWiped: true, wantMkfs: 1},
		{name: "a mark over another filesystem: refused, nothing zeroed", mark: "plain", remains: "xfs",
			code: codes.FailedPrecondition, wantMarked: true},
		{name: "a mark over a blank device", mark: "plain", wantMkfs: 1},
		{name: "a mark over an ext4 that was mounted: kept", mark: "own", remains: "ext4", mounted: true},
		{name: "a mark over an ext4 never mounted that checks clean: kept", mark: "plain", remains: "ext4"},
		{name: "a mark over a finished xfs: kept", fsType: "xfs", mark: "own", remains: "xfs"},
		{name: "a mark of an earlier LV of that name: dropped unread", mark: earlierLV, remains: "ext4", unfinished: true},
		{name: "no mark: a filesystem is mounted as it is", remains: "ext4"},
		{name: "no mark: another filesystem is refused", remains: "xfs", code: codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			vg, lv, _ := volume.ParseVolumeID(fx.id)
			uuid := fx.lvm.LVs[vg+"/"+lv].UUID
			var err error
			switch tt.mark {
			case "":
			case "plain":
				err = fx.formatting.Mark(vg, lv)
			case "own":
				err = fx.formatting.MarkOf(vg, lv, uuid)
			default:
				err = fx.formatting.MarkOf(vg, lv, tt.mark)
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.unfinished {
				fx.tools.SetRemains(fx.device, tt.remains)
			} else {
				fx.tools.SetFormat(fx.device, tt.remains)
			}
			if tt.mounted {
				fx.tools.SetMounted(fx.device)
			}
			var markedAtMkfs []bool
			fx.tools.FailIf(func(argv []string) bool {
				if !strings.HasPrefix(argv[0], "mkfs.") {
					return false
				}
				markedAtMkfs = append(markedAtMkfs, fx.formattingMarked(t, fx.id))
				return tt.failMkfs
			}, testingexec.FakeExitError{Status: 1})
			fsType := tt.fsType
			if fsType == "" {
				fsType = "ext4"
			}
			_, err = fx.ns.NodeStageVolume(context.Background(), fx.stageReq(mountCap(fsType, sw)))
			csitest.WantCode(t, err, tt.code)
			if got := len(fx.wiped) > 0; got != tt.wantWiped {
				t.Errorf("signature regions zeroed: %v, want %v", got, tt.wantWiped)
			}
			if len(markedAtMkfs) != tt.wantMkfs {
				t.Fatalf("mkfs ran %d times, want %d", len(markedAtMkfs), tt.wantMkfs)
			}
			for _, m := range markedAtMkfs {
				if !m {
					t.Error("mkfs ran while the volume was not marked")
				}
			}
			if got := fx.formattingMarked(t, fx.id); got != tt.wantMarked {
				t.Errorf("marked after the stage: %v, want %v", got, tt.wantMarked)
			}
			if tt.wantMarked && tt.wantMkfs > 0 {
				// The stage's own mark names the LV.
				if owner, _, err := fx.formatting.Owner(vg, lv); err != nil || owner != uuid {
					t.Errorf("the stage's mark names %q (%v), want the LV's UUID %s", owner, err, uuid)
				}
			}
		})
	}
}

// TestFormattingMarkGoesWithTheStageOrTheVolume: a stage that finds the
// volume mounted already (its mkfs ended; the stage before died before
// answering) takes the mark off, and so do CreateVolume and DeleteVolume of
// the volume, so that no mark outlives the filesystem it was made for.
func TestFormattingMarkGoesWithTheStageOrTheVolume(t *testing.T) {
	tests := []struct {
		name string
		do   func(t *testing.T, fx *nodeFixture)
	}{
		{"stage of a staged volume", func(t *testing.T, fx *nodeFixture) {
			if err := fx.mounter.Mount(fx.device, fx.staging, "ext4", nil); err != nil {
				t.Fatal(err)
			}
			fx.stage(t, mountCap("ext4", sw))
		}},
		{"DeleteVolume", func(t *testing.T, fx *nodeFixture) {
			if _, err := fx.cs.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: fx.id}); err != nil {
				t.Fatal(err)
			}
		}},
		{"CreateVolume", func(t *testing.T, fx *nodeFixture) {
			if _, err := fx.cs.CreateVolume(context.Background(), createReq("pvc-1", gib, nil)); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			vg, lv, _ := volume.ParseVolumeID(fx.id)
			if err := fx.formatting.Mark(vg, lv); err != nil {
				t.Fatal(err)
			}
			tt.do(t, fx)
			if fx.formattingMarked(t, fx.id) {
				t.Error("the formatting mark outlived it")
			}
			if len(fx.wiped) != 0 {
				t.Errorf("zeroed %v", fx.wiped)
			}
		})
	}
}

// TestFullStateDiskIsResourceExhausted: a stage that cannot write its
// formatting mark because the disk under the state directory is full
// answers RESOURCE_EXHAUSTED saying so, not INTERNAL, and formats nothing.
func TestFullStateDiskIsResourceExhausted(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	fx := newNodeFixture(t)
	vg, lv, _ := volume.ParseVolumeID(fx.id)
	// Every write to the mark fails as on a full disk.
	if err := os.MkdirAll(filepath.Join(fx.formatting.Dir(), vg), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/full", filepath.Join(fx.formatting.Dir(), vg, lv)); err != nil {
		t.Fatal(err)
	}
	_, err := fx.ns.NodeStageVolume(context.Background(), fx.stageReq(mountCap("ext4", sw)))
	csitest.WantCode(t, err, codes.ResourceExhausted, "--state-dir", "full")
	if ran := fx.tools.Ran("mkfs.ext4"); len(ran) != 0 {
		t.Errorf("mkfs ran without a mark: %v", ran)
	}
}
