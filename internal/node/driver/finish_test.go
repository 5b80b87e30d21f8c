package driver

import (
	"context"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
)

// TestCreateVolumeErasesByCapability: the edge tells the lifecycle a
// raw-block volume from a filesystem one by the request's capabilities
// (one block capability among them is enough); what each is erased with
// is the lifecycle's (internal/node/provision's finish tests).
func TestCreateVolumeErasesByCapability(t *testing.T) {
	block, mount := blockCap(sw), mountCap("ext4", sw)
	tests := []struct {
		name string
		caps []*csi.VolumeCapability
		want erase.Method
	}{
		{"block", []*csi.VolumeCapability{block}, erase.ZeroOut},
		{"block and mount", []*csi.VolumeCapability{mount, block}, erase.ZeroOut},
		{"filesystem", []*csi.VolumeCapability{mount}, erase.Signatures},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newControllerFixture(t)
			req := createReq("pvc-1", gib, nil)
			req.VolumeCapabilities = tt.caps
			if _, err := fx.cs.CreateVolume(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			want := []provisiontest.Erased{{Path: "/dev/vg1/" + volume.LVNameFor("pvc-1"), Method: tt.want}}
			if got := fx.eraser.Erasures(); !slices.Equal(got, want) {
				t.Errorf("erasures %v, want %v", got, want)
			}
		})
	}
}
