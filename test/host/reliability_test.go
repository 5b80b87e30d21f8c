//go:build hosttest

package host

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// twoVGs makes two volume groups that one lvm.conf sees: the fixture's
// VG on the first of two PVs, and a second VG on the other PV. The second
// is removed before the fixture's cleanup runs.
func twoVGs(t *testing.T) (*lvmtest.LoopVG, string) {
	t.Helper()
	vg := lvmtest.New(t, lvmtest.Options{Size: 512 * mib, PVs: 2})
	second := vg.Name + "-b"
	ctx := ctxFor(t)
	if _, err := vg.LVM(ctx, "vgreduce", vg.Name, vg.Devices[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := vg.LVM(ctx, "vgcreate", "--yes", second, vg.Devices[1]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Back into the fixture's VG, whatever the test did to the name.
		for _, name := range []string{second, second + "x"} {
			if _, err := vg.LVM(ctx, "vgremove", "--yes", "--force", name); err == nil {
				break
			}
		}
		if _, err := vg.LVM(ctx, "vgextend", vg.Name, vg.Devices[1]); err != nil {
			t.Errorf("giving the second PV back to %s: %v", vg.Name, err)
		}
	})
	return vg, second
}

// Real lvm2: a report names only the VGs asked for, and a missing VG is
// told apart from a missing LV (what DeleteVolume relies on).
func TestReportOfNamedVolumeGroupsOnRealLVM(t *testing.T) {
	vg, second := twoVGs(t)
	c := lvm.New(lvm.Options{Env: vg.Env(), Timeout: time.Minute})
	ctx := ctxFor(t)
	r, err := c.Report(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.VolumeGroups) != 1 || r.VolumeGroups[0].Name != second {
		t.Errorf("report of %s holds %+v", second, r.VolumeGroups)
	}
	if r, err := c.Report(ctx, vg.Name, second); err != nil || len(r.VolumeGroups) != 2 {
		t.Errorf("report of both: %v, %v", r, err)
	}
	if _, err := c.Report(ctx, "carve-no-such-vg"); !errors.Is(err, lvm.ErrVolumeGroupNotFound) {
		t.Errorf("report of a missing VG: %v, want ErrVolumeGroupNotFound", err)
	}
	// Either answer works for the view (it then reads each VG alone);
	// the log says which one this lvm2 gives.
	r, err = c.Report(ctx, vg.Name, "carve-no-such-vg")
	if err == nil {
		t.Logf("report of a present and a missing VG: exit 0, %d VGs", len(r.VolumeGroups))
		if len(r.VolumeGroups) != 1 || r.VolumeGroups[0].Name != vg.Name {
			t.Errorf("report of a present and a missing VG holds %+v", r.VolumeGroups)
		}
	} else {
		t.Logf("report of a present and a missing VG: %v", err)
	}
	if _, err := c.GetLV(ctx, "carve-no-such-vg", "lv"); !errors.Is(err, lvm.ErrVolumeGroupNotFound) {
		t.Errorf("GetLV in a missing VG: %v, want ErrVolumeGroupNotFound", err)
	}
	if _, err := c.GetLV(ctx, vg.Name, "nosuchlv"); !errors.Is(err, lvm.ErrNotFound) || errors.Is(err, lvm.ErrVolumeGroupNotFound) {
		t.Errorf("GetLV of a missing LV: %v, want ErrNotFound but not ErrVolumeGroupNotFound", err)
	}
}

// The plugin with two classes on two VGs, one of which vanishes: only its
// class reports 0 and refuses new volumes with RESOURCE_EXHAUSTED, the
// other keeps working, readiness names the bad class, and a volume of the
// vanished VG is not reported deleted (UNAVAILABLE) until the VG is back.
func TestPluginOneBadClassOnRealLVM(t *testing.T) {
	vg, second := twoVGs(t)
	bin := buildCarve(t)
	config := fmt.Sprintf("deviceClasses:\n  - {name: fast, volumeGroup: %s, default: true}\n  - {name: slow, volumeGroup: %s}\n", vg.Name, second)
	p, stop := startRefreshingPlugin(t, bin, t.TempDir(), vg, config)
	defer stop()
	ctx := ctxFor(t)
	ctrl := csi.NewControllerClient(p.Conn)
	capability := plugintest.MountCapability("ext4")
	create := func(name, class string) (string, error) {
		rsp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 * mib},
			VolumeCapabilities: []*csi.VolumeCapability{capability}, Parameters: map[string]string{"carve.dev/device-class": class}})
		return rsp.GetVolume().GetVolumeId(), err
	}
	capacity := func(class string) int64 {
		rsp, err := ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"carve.dev/device-class": class}})
		if err != nil {
			t.Fatal(err)
		}
		return rsp.GetAvailableCapacity()
	}
	slowID, err := create("pvc-slow", "slow")
	if err != nil {
		t.Fatal(err)
	}
	fastBefore := capacity("fast")

	// The second VG vanishes (as when its disk is not seen).
	if _, err := vg.LVM(ctx, "vgrename", second, second+"x"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for capacity("slow") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("class slow still reports capacity 30 s after its VG vanished")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := capacity("fast"); got != fastBefore {
		t.Errorf("class fast reports %d, was %d: a healthy class changed", got, fastBefore)
	}
	if _, err := create("pvc-slow-2", "slow"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("CreateVolume in the class whose VG vanished: %v, want ResourceExhausted", err)
	}
	fastID, err := create("pvc-fast", "fast")
	if err != nil {
		t.Errorf("CreateVolume in the healthy class: %v", err)
	}
	base := strings.TrimSuffix(p.MetricsURL, "/metrics")
	if code, body := httpGet(ctx, t, base+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready: vg-missing\n" {
		t.Errorf("/readyz: %d %q, want 503 with the reason code only", code, body)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: slowID}); status.Code(err) != codes.Unavailable {
		t.Errorf("DeleteVolume while its VG is missing: %v, want Unavailable", err)
	}

	// Back: the retried delete removes the LV, which was there all along.
	if _, err := vg.LVM(ctx, "vgrename", second+"x", second); err != nil {
		t.Fatal(err)
	}
	if _, err := vg.LVM(ctx, "lvs", slowID); err != nil {
		t.Fatalf("the LV of %s is not there once its VG is back: %v", slowID, err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: slowID}); err != nil {
		t.Errorf("DeleteVolume once the VG is back: %v", err)
	}
	if _, err := vg.LVM(ctx, "lvs", slowID); err == nil {
		t.Errorf("the LV of %s is still there after the retried DeleteVolume", slowID)
	}
	if fastID != "" {
		if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: fastID}); err != nil {
			t.Errorf("DeleteVolume %s: %v", fastID, err)
		}
	}
}
