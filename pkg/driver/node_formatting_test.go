package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/carve-csi/carve/pkg/volume"
)

// TestStageRemakesAFilesystemWhoseMkfsNeverEnded: a stage marks the
// volume before mkfs and takes the mark off before it answers. A mark
// found at the next stage means an mkfs that never ended (the plugin's
// container killed with it, or the node down): its remains, whatever
// signature they show, are zeroed and the filesystem is made again.
// Without a mark, a signature is treated as ever: mounted when it is the
// asked filesystem, refused when it is another.
func TestStageRemakesAFilesystemWhoseMkfsNeverEnded(t *testing.T) {
	tests := []struct {
		name       string
		marked     bool   // a mark left by an earlier stage
		remains    string // the signature on the device ("" blank)
		failMkfs   bool
		code       codes.Code
		wantWiped  bool
		wantMkfs   int
		wantMarked bool // after the stage
	}{
		{name: "blank device", wantMkfs: 1},
		{name: "mkfs failed: the mark stays for the retry", failMkfs: true, code: codes.Internal, wantMkfs: 1, wantMarked: true},
		{name: "remains of a killed mkfs.ext4", marked: true, remains: "ext4", wantWiped: true, wantMkfs: 1},
		{name: "remains of a killed mkfs of another filesystem", marked: true, remains: "xfs", wantWiped: true, wantMkfs: 1},
		{name: "a mark over a blank device", marked: true, wantWiped: true, wantMkfs: 1},
		{name: "no mark: a filesystem is mounted as it is", remains: "ext4"},
		{name: "no mark: another filesystem is refused", remains: "xfs", code: codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			vg, lv, _ := volume.ParseVolumeID(fx.id)
			if tt.marked {
				if err := fx.formatting.Mark(vg, lv); err != nil {
					t.Fatal(err)
				}
			}
			fx.tools.SetFormat(fx.device, tt.remains)
			var markedAtMkfs []bool
			fx.tools.FailIf(func(argv []string) bool {
				if !strings.HasPrefix(argv[0], "mkfs.") {
					return false
				}
				markedAtMkfs = append(markedAtMkfs, fx.formattingMarked(t, fx.id))
				return tt.failMkfs
			}, testingexec.FakeExitError{Status: 1})
			_, err := fx.ns.NodeStageVolume(context.Background(), fx.stageReq(mountCap("ext4", sw)))
			wantCode(t, err, tt.code)
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
