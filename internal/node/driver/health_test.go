package driver

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

func TestVolumeHealth(t *testing.T) {
	healthy := lvm.Attributes{Type: lvm.TypeThick, Active: true, Health: lvm.HealthOK, Raw: "-wi-a-----"}
	tests := []struct {
		name    string
		attr    lvm.Attributes
		pool    *lvm.ThinPool
		want    []csi.VolumeHealthErrorType
		reasons []string
	}{
		{name: "healthy", attr: healthy},
		{name: "healthy thin", attr: healthy, pool: &lvm.ThinPool{Name: "pool", DataPercent: 50, MetadataPercent: 10}},
		{name: "raid writemostly is normal", attr: lvm.Attributes{Active: true, Health: lvm.HealthWriteMostly}},
		{name: "inactive", attr: lvm.Attributes{Health: lvm.HealthOK, Raw: "-wi-------"},
			want: []csi.VolumeHealthErrorType{csi.VolumeHealthErrorType_INACCESSIBLE}, reasons: []string{"LogicalVolumeInactive"}},
		{name: "partial", attr: lvm.Attributes{Active: true, Health: lvm.HealthPartial},
			want: []csi.VolumeHealthErrorType{csi.VolumeHealthErrorType_INACCESSIBLE}, reasons: []string{"PhysicalVolumeMissing"}},
		{name: "failed and inactive", attr: lvm.Attributes{Health: lvm.HealthFailed},
			want: []csi.VolumeHealthErrorType{csi.VolumeHealthErrorType_INACCESSIBLE, csi.VolumeHealthErrorType_INACCESSIBLE}, reasons: []string{"LogicalVolumeFailed", "LogicalVolumeInactive"}},
		{name: "refresh needed", attr: lvm.Attributes{Active: true, Health: lvm.HealthRefreshNeeded},
			want: []csi.VolumeHealthErrorType{csi.VolumeHealthErrorType_DEGRADED}, reasons: []string{"LogicalVolumeDegraded"}},
		{name: "unknown", attr: lvm.Attributes{Active: true, Health: lvm.HealthUnknown},
			want: []csi.VolumeHealthErrorType{csi.VolumeHealthErrorType_UNKNOWN_VOLUME_HEALTH_TYPE}, reasons: []string{"LogicalVolumeHealthUnknown"}},
		{name: "full pool data", attr: healthy, pool: &lvm.ThinPool{Name: "pool", DataPercent: 99},
			want: []csi.VolumeHealthErrorType{csi.VolumeHealthErrorType_DEGRADED}, reasons: []string{"ThinPoolFull"}},
		{name: "full pool metadata", attr: healthy, pool: &lvm.ThinPool{Name: "pool", MetadataPercent: 95},
			want: []csi.VolumeHealthErrorType{csi.VolumeHealthErrorType_DEGRADED}, reasons: []string{"ThinPoolFull"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := volumeHealth("vg/carve-x", &lvm.LogicalVolume{Attr: tt.attr}, tt.pool)
			if h.GetVolumeId() != "vg/carve-x" {
				t.Errorf("volume ID %q", h.GetVolumeId())
			}
			if len(h.GetHealthStatuses()) != len(tt.want) {
				t.Fatalf("statuses %v, want %v", h.GetHealthStatuses(), tt.want)
			}
			for i, e := range h.GetHealthStatuses() {
				if e.GetStatus() != tt.want[i] || e.GetReason() != tt.reasons[i] || e.GetMessage() == "" {
					t.Errorf("status %d = %v, want %v %s", i, e, tt.want[i], tt.reasons[i])
				}
			}
		})
	}
}

func TestControllerVolumeHealthRPCs(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	good := mustCreate(t, fx, "good", nil)
	bad1 := mustCreate(t, fx, "bad-1", nil)
	bad2 := mustCreate(t, fx, "bad-2", nil)
	fx.lvm.Mu.Lock()
	fx.lvm.LVs[bad1].Attr.Active = false
	fx.lvm.LVs[bad2].Attr.Health = lvm.HealthPartial
	fx.lvm.Mu.Unlock()
	if err := fx.view.Refresh(ctx); err != nil {
		t.Fatal(err)
	}

	resp, err := fx.cs.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: good})
	if err != nil || resp.GetVolumeHealth().GetVolumeId() != good || len(resp.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Errorf("healthy volume: %v, %v", resp, err)
	}
	resp, err = fx.cs.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: bad1})
	if err != nil || len(resp.GetVolumeHealth().GetHealthStatuses()) != 1 {
		t.Errorf("inactive volume: %v, %v", resp, err)
	}
	_, err = fx.cs.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{})
	csitest.WantCode(t, err, codes.InvalidArgument)
	_, err = fx.cs.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: volume.VolumeID("vg1", volume.LVNameFor("never"))})
	csitest.WantCode(t, err, codes.NotFound)

	list, err := fx.cs.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, e := range list.GetEntries() {
		got[e.GetVolumeId()] = true
	}
	if len(got) != 2 || !got[bad1] || !got[bad2] {
		t.Errorf("listed %v; want only the two abnormal volumes", got)
	}
	page, err := fx.cs.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{MaxEntries: 1})
	if err != nil || len(page.GetEntries()) != 1 || page.GetNextToken() == "" {
		t.Fatalf("first page %v, %v", page, err)
	}
	next, err := fx.cs.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{MaxEntries: 1, StartingToken: page.GetNextToken()})
	if err != nil || len(next.GetEntries()) != 1 || next.GetEntries()[0].GetVolumeId() == page.GetEntries()[0].GetVolumeId() || next.GetNextToken() != "" {
		t.Errorf("second page %v, %v", next, err)
	}
	_, err = fx.cs.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{StartingToken: "nope"})
	csitest.WantCode(t, err, codes.Aborted)
}
