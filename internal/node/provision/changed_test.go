package provision

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// TestChangedBlocks: one function names the changes since a base for a
// backup's delta (a later snapshot) and for a move's catch-up (the volume
// itself): thin_delta for a thin pair in one pool; the base's exception
// table for a thick volume, both tables for two thick snapshots, and the
// bytes the volume grew by; a pair no metadata maps is ErrRefused, a
// failure of the metadata is not (the catch-up compares, the delta fails).
func TestChangedBlocks(t *testing.T) {
	const size = 64 << 20
	vol := volume.LVNameFor("pvc-a")
	thinVol := lvm.LogicalVolume{VolumeGroup: "vg1", Name: vol, Size: size, Pool: "pool0", Attr: lvm.Attributes{Type: lvm.TypeThin}}
	thinSnap := func(name, pool string) lvm.LogicalVolume {
		return lvm.LogicalVolume{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor(name), Size: size, Pool: pool, Attr: lvm.Attributes{Type: lvm.TypeThin}}
	}
	thickVol := lvm.LogicalVolume{VolumeGroup: "vg1", Name: vol, Size: size, Attr: lvm.Attributes{Type: lvm.TypeThick}}
	cow := func(name, origin string, size uint64) lvm.LogicalVolume {
		return lvm.LogicalVolume{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor(name), Size: 8 << 20, Origin: origin,
			Tags: []string{volume.SizeTag(size)}, Attr: lvm.Attributes{Type: lvm.TypeSnapshot}}
	}
	grown := thickVol
	grown.Size = size + 1<<20
	found := changemap.Set{{Off: 1 << 20, Len: 64 << 10}}
	s1, s2 := volume.SnapshotLVNameFor("s1"), volume.SnapshotLVNameFor("s2")
	tests := []struct {
		name       string
		base, lv   lvm.LogicalVolume
		noFinder   bool
		finderErr  error
		wantMethod string
		want       changemap.Set
		wantAsked  []string
		refused    string // the message of an ErrRefused
	}{
		{name: "thin snapshots (a backup's delta)", base: thinSnap("s1", "pool0"), lv: thinSnap("s2", "pool0"), wantMethod: MapThinDelta, want: found,
			wantAsked: []string{"thin vg1/pool0 " + s1 + ".." + s2}},
		{name: "a thin volume since its snapshot (a catch-up)", base: thinSnap("s1", "pool0"), lv: thinVol, wantMethod: MapThinDelta, want: found,
			wantAsked: []string{"thin vg1/pool0 " + s1 + ".." + vol}},
		{name: "thick snapshots", base: cow("s1", vol, size), lv: cow("s2", vol, size), wantMethod: MapCOW, want: found,
			wantAsked: []string{"cow vg1/" + s1, "cow vg1/" + s2}},
		{name: "a thick volume since its snapshot", base: cow("s1", vol, size), lv: thickVol, wantMethod: MapCOW, want: found,
			wantAsked: []string{"cow vg1/" + s1}},
		{name: "a thick volume grown since", base: cow("s1", vol, size), lv: grown, wantMethod: MapCOW,
			want: changemap.Set{{Off: 1 << 20, Len: 64 << 10}, {Off: size, Len: 1 << 20}}, wantAsked: []string{"cow vg1/" + s1}},
		{name: "thick snapshots grown between", base: cow("s1", vol, size), lv: cow("s2", vol, size+1<<20), wantMethod: MapCOW,
			want: changemap.Set{{Off: 1 << 20, Len: 64 << 10}, {Off: size, Len: 1 << 20}}, wantAsked: []string{"cow vg1/" + s1, "cow vg1/" + s2}},
		{name: "thin_delta fails", base: thinSnap("s1", "pool0"), lv: thinVol, finderErr: errors.New("exit status 1"), wantMethod: MapThinDelta,
			wantAsked: []string{"thin vg1/pool0 " + s1 + ".." + vol}},
		{name: "an exception table cannot be read", base: cow("s1", vol, size), lv: cow("s2", vol, size), finderErr: errors.New("not a store"), wantMethod: MapCOW,
			wantAsked: []string{"cow vg1/" + s1}},
		{name: "pools differ", base: thinSnap("s1", "pool1"), lv: thinVol, refused: `the base is in thin pool "pool1", the volume in "pool0"`},
		{name: "a thin base of a thick volume", base: thinSnap("s1", "pool0"), lv: thickVol, refused: "changes of a thick LV"},
		{name: "a thick base of another volume", base: cow("s1", "other", size), lv: thickVol, refused: `since a snapshot base (origin "other")`},
		{name: "thick snapshots of two volumes", base: cow("s1", "other", size), lv: cow("s2", vol, size), refused: "no metadata maps"},
		{name: "no finder", base: thinSnap("s1", "pool0"), lv: thinVol, noFinder: true, refused: "names no changes from device-mapper metadata"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := remoteProvisioner(t, newCopyLVM(nil), nil)
			finder := &changeFinder{set: found, err: tt.finderErr}
			p.cfg.Changes = finder
			if tt.noFinder {
				p.cfg.Changes = nil
			}
			method, set, err := p.changedBlocks(t.Context(), &tt.base, &tt.lv)
			switch {
			case tt.refused != "":
				if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("got %v, want %v saying %q", err, ErrRefused, tt.refused)
				}
			case tt.finderErr != nil:
				if err == nil || errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tt.wantMethod+" failed: "+tt.finderErr.Error()) {
					t.Fatalf("got %v, want the finder's error named by %s", err, tt.wantMethod)
				}
			case err != nil:
				t.Fatal(err)
			}
			if method != tt.wantMethod || !slices.Equal(set, tt.want) {
				t.Errorf("got %v by %q, want %v by %q", set, method, tt.want, tt.wantMethod)
			}
			if !slices.Equal(finder.asked, tt.wantAsked) {
				t.Errorf("asked %q, want %q", finder.asked, tt.wantAsked)
			}
		})
	}
}
