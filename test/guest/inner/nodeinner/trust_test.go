//go:build guestinner

package nodeinner

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/test/harness/plugintest"
)

// TestStageRefusesAVolumeGroupItDoesNotServe: a static PV can name any
// handle and any class. One naming an LV (tagged as carve's, active, with
// its device node) in a volume group no device class of the node uses,
// with a class of another volume group in its volume context, is refused
// with FAILED_PRECONDITION naming volume_id, by NodeStage and by a block
// NodePublish alike, and the LV is neither formatted nor mounted. Before
// the stage's fast path checked the request, the class and the device node
// were enough: the stage formatted the LV.
func TestStageRefusesAVolumeGroupItDoesNotServe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "unserved", 512*mib)
	// The plugin's only class is on another volume group (absent: the
	// plugin serves, not ready), so this VG is one it does not serve.
	e.stop()
	e.config = "deviceClasses:\n  - name: " + class + "\n    volumeGroup: " + e.vg.Name + "x\n    default: true\n"
	e.notReadyOK = true
	e.start()
	lv := "carve-" + strings.Repeat("6e", 16)
	if _, err := e.vg.LVM(ctx, "lvcreate", "--yes", "--size", "64m", "--name", lv,
		"--addtag", "carve.dev/owner=carve", "--addtag", "carve.dev/class="+class, e.vg.Name); err != nil {
		t.Fatal(err)
	}
	id := e.vg.Name + "/" + lv
	e.volumeContext = map[string]map[string]string{id: {"carve.dev/device-class": class}}
	dev := plugintest.MustDevicePath(t, id)
	p := e.paths("unserved")

	err := e.stage(id, p, plugintest.MountCapability("ext4"), rpcTimeout)
	wantRefused(t, "NodeStageVolume", err)
	pctx, cancel := e.ctx()
	defer cancel()
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	_, err = e.node().NodePublishVolume(pctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: p.staging,
		TargetPath: filepath.Join(p.target, "dev"), VolumeCapability: block, VolumeContext: e.volumeContext[id]})
	wantRefused(t, "NodePublishVolume (block)", err)

	if uuid, err := plugintest.FilesystemUUID(ctx, dev); uuid != "" {
		t.Errorf("the LV of the volume group carve does not serve was formatted (filesystem UUID %s, %v)", uuid, err)
	}
	for _, path := range []string{p.staging, filepath.Join(p.target, "dev")} {
		if ok, _ := plugintest.IsMountPoint(path); ok {
			t.Errorf("%s is mounted", path)
		}
	}
}

func wantRefused(t *testing.T, call string, err error) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "volume_id") {
		t.Errorf("%s of an LV in a volume group no class uses: %v; want FAILED_PRECONDITION naming volume_id", call, err)
		return
	}
	t.Logf("%s: %v", call, err)
}
