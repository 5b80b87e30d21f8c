//go:build hosttest

package host

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// fillMetadataArea creates LVs outside carve, with tags as long as LVM
// takes, until the VG's metadata area refuses one more: first LVs of 60
// tags of 1000 bytes, then fewer and shorter, then none, so the area ends
// with less room than any LV needs. It returns how many LVs it made.
func fillMetadataArea(ctx context.Context, t *testing.T, vg *lvmtest.LoopVG) int {
	t.Helper()
	n := 0
	for _, tags := range []int{60, 8, 1, 0} {
		for {
			args := []string{"lvcreate", "--yes", "--extents", "1", "--name", fmt.Sprintf("filler%d", n)}
			for i := range tags {
				args = append(args, "--addtag", fmt.Sprintf("t%d.%d-%s", n, i, strings.Repeat("x", 990)))
			}
			out, err := vg.LVM(ctx, append(args, vg.Name)...)
			if err != nil {
				if !strings.Contains(err.Error()+string(out), "exceeds maximum metadata size") {
					t.Fatalf("filler lvcreate failed for another reason than metadata space: %v", err)
				}
				break
			}
			n++
		}
	}
	return n
}

// TestMetadataAreaFullIsResourceExhausted: on real lvm2, a volume group
// whose metadata area is full while most of its extents are free reports
// its metadata figures, gives the class no capacity, and CreateVolume
// answers RESOURCE_EXHAUSTED naming the metadata area (not Internal, and
// without running an lvcreate that would fail). lvcreate's own failure in
// that state is classified as out of space.
func TestMetadataAreaFullIsResourceExhausted(t *testing.T) {
	vg, client, _ := setup(t, lvmtest.Options{Size: 1 << 30})
	ctx := ctxFor(t)
	fillers := fillMetadataArea(ctx, t, vg)
	rep, err := client.Report(ctx, vg.Name)
	if err != nil {
		t.Fatal(err)
	}
	v := rep.FindVG(vg.Name)
	if v == nil || v.MetadataAreaSize == 0 || !v.MetadataFull() || v.Free < 512<<20 {
		t.Fatalf("after %d fillers the VG is %+v; want a full metadata area and free extents", fillers, v)
	}
	t.Logf("%d filler LVs; metadata area %d bytes, %d free; %d bytes of extents free", fillers, v.MetadataAreaSize, v.MetadataAreaFree, v.Free)

	_, err = client.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: vg.Name, Name: "one-more", Size: 4 << 20})
	if !errors.Is(err, lvm.ErrInsufficientSpace) || !strings.Contains(err.Error(), "metadata area is full") {
		t.Errorf("lvcreate in a VG with a full metadata area: %v; want ErrInsufficientSpace naming the metadata area", err)
	}

	p := startPlugin(t, buildCarve(t), t.TempDir(), vg, thickConfig(vg.Name))
	cc := csi.NewControllerClient(p.Conn)
	capResp, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"carve.dev/device-class": "fast"}})
	if err != nil || capResp.GetAvailableCapacity() != 0 {
		t.Errorf("GetCapacity with a full metadata area: %d, %v; want 0", capResp.GetAvailableCapacity(), err)
	}
	_, err = cc.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-metadata",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 8 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}, AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "metadata area") {
		t.Errorf("CreateVolume with a full metadata area: %v; want ResourceExhausted naming the metadata area", err)
	}
	ms := scrape(ctx, t, p)
	if free, ok, err := ms.Gauge("carve_volume_group_metadata_free_bytes", map[string]string{"device_class": "fast"}); err != nil || !ok || free >= lvm.LVMetadataBytes {
		t.Errorf("carve_volume_group_metadata_free_bytes = %v (present %v, %v); want below %d", free, ok, err, lvm.LVMetadataBytes)
	}
}
