package provision

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
)

// blockSnaps are snapshots of node-b for the block map tests: two thin
// ones of one volume (old, new), two thick ones of another (cold,
// cnew, the volume grown by 1 MiB in between), and a thin one of a
// third volume (other).
func blockSnaps(t *testing.T) (lvs []lvm.LogicalVolume, id func(name string) string) {
	t.Helper()
	const size = 64 << 20
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	thin := func(name, origin string, when time.Time) lvm.LogicalVolume {
		return lvm.LogicalVolume{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor(name), Size: size, Pool: "pool0", Time: when,
			Tags: volume.SnapshotTags(name, "thin", volume.LVNameFor(origin)), Attr: lvm.Attributes{Type: lvm.TypeThin}}
	}
	thick := func(name string, size uint64, when time.Time) lvm.LogicalVolume {
		return lvm.LogicalVolume{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor(name), Size: 8 << 20, Origin: volume.LVNameFor("pvc-thick"), Time: when,
			Tags: append(volume.SnapshotTags(name, "fast", volume.LVNameFor("pvc-thick")), volume.SizeTag(size)), Attr: lvm.Attributes{Type: lvm.TypeSnapshot, Active: true}}
	}
	lvs = []lvm.LogicalVolume{thin("old", "pvc-thin", at), thin("new", "pvc-thin", at.Add(time.Hour)), thin("other", "pvc-other", at),
		thick("cold", size, at), thick("cnew", size+1<<20, at.Add(time.Hour))}
	return lvs, func(name string) string { return volume.SnapshotID("node-b", "vg1", volume.SnapshotLVNameFor(name)) }
}

// blocksOf is the block map of snap: what is allocated when base is "",
// else what changed since base; id names the snapshots.
func blocksOf(t *testing.T, p *Provisioner, id func(string) string, base, snap string) (BlockMap, error) {
	if base == "" {
		return p.SnapshotAllocated(t.Context(), id(snap))
	}
	return p.SnapshotDelta(t.Context(), id(base), id(snap))
}

// TestSnapshotBlocks: a thin snapshot's allocated blocks are its
// mappings, a thick one's the whole volume; a thin delta is thin_delta
// between the two snapshots, a thick delta the union of both exception
// tables and the bytes the volume grew by; every map is cut at the
// volume's size; the snapshots' locks are released after.
func TestSnapshotBlocks(t *testing.T) {
	lvs, id := blockSnaps(t)
	const size = 64 << 20
	found := changemap.Set{{Off: 1 << 20, Len: 64 << 10}, {Off: size - 64<<10, Len: 128 << 10}} // the last block runs past the end
	clipped := changemap.Set{{Off: 1 << 20, Len: 64 << 10}, {Off: size - 64<<10, Len: 64 << 10}}
	tests := []struct {
		name       string
		base, snap string
		wantCap    uint64
		want       changemap.Set
		wantMethod string
		wantAsked  []string
	}{
		{"thin allocated", "", "old", size, clipped, MapThinDump, []string{"mapped vg1/pool0 " + volume.SnapshotLVNameFor("old")}},
		{"thick allocated", "", "cold", size, changemap.Set{{Off: 0, Len: size}}, MapWhole, nil},
		{"thin delta", "old", "new", size, clipped, MapThinDelta, []string{"thin vg1/pool0 " + volume.SnapshotLVNameFor("old") + ".." + volume.SnapshotLVNameFor("new")}},
		{"thick delta", "cold", "cnew", size + 1<<20, changemap.Set{{Off: 1 << 20, Len: 64 << 10}, {Off: size - 64<<10, Len: 1<<20 + 64<<10}}, MapCOW,
			[]string{"cow vg1/" + volume.SnapshotLVNameFor("cold"), "cow vg1/" + volume.SnapshotLVNameFor("cnew")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCopyLVM(nil, lvs...)
			p := remoteProvisioner(t, f, nil)
			finder := &changeFinder{set: found}
			p.cfg.Changes = finder
			m, err := blocksOf(t, p, id, tt.base, tt.snap)
			if err != nil {
				t.Fatal(err)
			}
			if m.Capacity != tt.wantCap || !slices.Equal(m.Blocks, tt.want) || m.Method != tt.wantMethod {
				t.Errorf("got %d bytes, %v by %s; want %d, %v by %s", m.Capacity, m.Blocks, m.Method, tt.wantCap, tt.want, tt.wantMethod)
			}
			if !slices.Equal(finder.asked, tt.wantAsked) {
				t.Errorf("asked %q, want %q", finder.asked, tt.wantAsked)
			}
			if names := p.BusyNames(); len(names) != 0 {
				t.Errorf("locks held after the call: %v", names)
			}
		})
	}
}

// TestSnapshotBlocksRefused: bad input is refused with the kind its
// code comes from and a message naming the field; no lock stays held.
func TestSnapshotBlocksRefused(t *testing.T) {
	lvs, id := blockSnaps(t)
	overflowed := slices.Clone(lvs)
	overflowed[3].Attr.SnapshotInvalid = true
	untagged := slices.Clone(lvs)
	untagged[4].Tags = volume.SnapshotTags("cnew", "fast", volume.LVNameFor("pvc-thick"))
	tests := []struct {
		name       string
		lvs        []lvm.LogicalVolume
		base, snap string
		hold       string
		finderErr  error
		kind       error
		msg        string
	}{
		{name: "no snapshot", kind: ErrInvalid, msg: "snapshot_id: must be set"},
		{name: "no base", snap: id("new"), base: "-", kind: ErrInvalid, msg: "base_snapshot_id: must be set"},
		{name: "not an ID", snap: "vg1/carve-0", kind: ErrNotFound, msg: "snapshot_id: snapshot \"vg1/carve-0\" does not exist"},
		{name: "unknown", snap: id("gone"), kind: ErrNotFound, msg: "snapshot_id: snapshot " + id("gone") + " does not exist"},
		{name: "unknown target", base: id("old"), snap: id("gone"), kind: ErrNotFound, msg: "target_snapshot_id: snapshot"},
		{name: "of another node", snap: volume.SnapshotID("node-a", "vg1", volume.SnapshotLVNameFor("old")), kind: ErrNotFound, msg: "snapshot_id: snapshot node-a/"},
		{name: "base of another volume", base: id("other"), snap: id("new"), kind: ErrInvalid, msg: "base_snapshot_id: snapshot " + id("other") + " is of volume vg1/" + volume.LVNameFor("pvc-other")},
		{name: "base newer than the target", base: id("new"), snap: id("old"), kind: ErrInvalid, msg: "base_snapshot_id: snapshot " + id("new") + " was taken at 2026-12-06T11:00:00Z, after"},
		{name: "thin base of a thick target", base: id("old"), snap: id("cnew"), kind: ErrInvalid, msg: "base_snapshot_id"},
		{name: "the same snapshot twice", base: id("old"), snap: id("old"), kind: ErrInvalid, msg: "both name snapshot"},
		{name: "being made", snap: id("new"), hold: "new", kind: ErrBusy, msg: "snapshot_id " + id("new") + " (a snapshot being made or deleted)"},
		{name: "base being made", base: id("old"), snap: id("new"), hold: "old", kind: ErrBusy, msg: "base_snapshot_id"},
		{name: "overflowed", lvs: overflowed, base: id("cold"), snap: id("cnew"), kind: ErrRefused, msg: "base_snapshot_id: snapshot " + id("cold") + ": snapshot LV"},
		{name: "a thick target without its size tag", lvs: untagged, base: id("cold"), snap: id("cnew"), kind: ErrRefused, msg: "target_snapshot_id: snapshot " + id("cnew") + " records no size"},
		{name: "metadata snapshot held", snap: id("new"), finderErr: changemap.ErrMetadataSnapHeld, kind: ErrUnavailable, msg: "held already"},
		{name: "thin_dump fails", snap: id("new"), finderErr: errors.New("exit status 1"), kind: ErrInternal, msg: "the mapped blocks of snapshot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCopyLVM(nil, lvs...)
			if tt.lvs != nil {
				f = newCopyLVM(nil, tt.lvs...)
			}
			p := remoteProvisioner(t, f, nil)
			p.cfg.Changes = &changeFinder{err: tt.finderErr}
			if tt.hold != "" {
				unlock, err := p.Lock(volume.SnapshotLVNameFor(tt.hold), "test")
				if err != nil {
					t.Fatal(err)
				}
				defer unlock()
			}
			var err error
			switch tt.base {
			case "":
				_, err = p.SnapshotAllocated(t.Context(), tt.snap)
			case "-":
				_, err = p.SnapshotDelta(t.Context(), "", tt.snap)
			default:
				_, err = p.SnapshotDelta(t.Context(), tt.base, tt.snap)
			}
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v, want %v saying %q", err, tt.kind, tt.msg)
			}
			want := 0
			if tt.hold != "" {
				want = 1
			}
			if names := p.BusyNames(); len(names) != want {
				t.Errorf("locks held after the call: %v", names)
			}
		})
	}
}

// noDeviceMapper is an LVM on a host without device-mapper: activation
// fails, and is counted.
type noDeviceMapper struct {
	*provisiontest.LVM
	activations int
}

func (f *noDeviceMapper) ActivateLV(_ context.Context, vg, name string) (*lvm.LogicalVolume, error) {
	f.activations++
	return nil, errors.New("activating " + vg + "/" + name + ": no device-mapper")
}

// TestSnapshotBlocksActivateOnlyWhatTheyRead: a thick snapshot's
// allocated blocks (its whole volume) are answered without activating it,
// so on a node whose device-mapper cannot activate it too, and so is the
// refusal of a delta between LVs that carry no metadata (plain LVs tagged
// as snapshots); a thin snapshot's blocks are read from its device's
// table, so it is activated.
func TestSnapshotBlocksActivateOnlyWhatTheyRead(t *testing.T) {
	lvs, id := blockSnaps(t)
	plain := func(name string, when time.Time) lvm.LogicalVolume {
		return lvm.LogicalVolume{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor(name), Size: 64 << 20, Time: when,
			Tags: volume.SnapshotTags(name, "fast", volume.LVNameFor("pvc-plain")), Attr: lvm.Attributes{Type: lvm.TypeThick}}
	}
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	lvs = append(lvs, plain("p1", at), plain("p2", at.Add(time.Minute)))
	for _, tt := range []struct {
		base, snap      string
		wantActivations int
		wantErr         string
	}{{"", "cold", 0, ""}, {"", "old", 1, "no device-mapper"}, {"p1", "p2", 0, "no metadata maps"}} {
		t.Run(tt.base+".."+tt.snap, func(t *testing.T) {
			f := &noDeviceMapper{LVM: newCopyLVM(nil, lvs...)}
			p := remoteProvisioner(t, f.LVM, nil)
			p.cfg.LVM = f
			p.cfg.IsDeviceNode = func(string) bool { return false }
			p.cfg.Changes = &changeFinder{}
			m, err := blocksOf(t, p, id, tt.base, tt.snap)
			if (tt.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.wantErr) || f.activations != tt.wantActivations {
				t.Fatalf("got %v (%v) after %d activations; want an error saying %q, %d activations", m.Blocks, err, f.activations, tt.wantErr, tt.wantActivations)
			}
			if tt.wantErr == "" && (m.Method != MapWhole || !slices.Equal(m.Blocks, changemap.Set{{Off: 0, Len: 64 << 20}})) {
				t.Errorf("got %v by %s, want the whole volume", m.Blocks, m.Method)
			}
		})
	}
}

// thinIDs is noDeviceMapper whose LVM tells thin IDs (failing for the
// names in fail).
type thinIDs struct {
	noDeviceMapper
	ids  map[string]uint64
	fail bool
}

func (f *thinIDs) ThinID(_ context.Context, vg, name string) (uint64, error) {
	if f.fail {
		return 0, errors.New("lvs failed")
	}
	id, ok := f.ids[name]
	if !ok {
		return 0, lvm.ErrNotFound
	}
	return id, nil
}

// TestSnapshotBlocksReadThinIDsFromLVM: with the pool active, a thin
// snapshot's blocks are read by the thin IDs LVM's metadata gives, with no
// snapshot activated; with the pool inactive, or LVM failing to tell, the
// snapshots are activated to read their tables, as before.
func TestSnapshotBlocksReadThinIDsFromLVM(t *testing.T) {
	lvs, id := blockSnaps(t)
	ids := map[string]uint64{volume.SnapshotLVNameFor("old"): 7, volume.SnapshotLVNameFor("new"): 9}
	for _, tt := range []struct {
		name            string
		base            string
		poolActive      bool
		fail            bool
		wantAsked       string
		wantActivations int
	}{
		{"allocated", "", true, false, "mapped id vg1/pool0 9", 0},
		{"delta", "old", true, false, "thin ids vg1/pool0 7..9", 0},
		{"pool inactive", "old", false, false, "", 1},
		{"LVM fails", "", true, true, "", 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &thinIDs{ids: ids, fail: tt.fail}
			f.LVM = newCopyLVM(nil, lvs...)
			p := remoteProvisioner(t, f.LVM, nil)
			p.cfg.LVM = f
			p.cfg.IsDeviceNode = func(string) bool { return false }
			finder := &changeFinder{set: changemap.Set{{Off: 0, Len: 64 << 10}}, poolActive: tt.poolActive}
			p.cfg.Changes = finder
			_, err := blocksOf(t, p, id, tt.base, "new")
			if (tt.wantActivations == 0) != (err == nil) || f.activations != tt.wantActivations || strings.Join(finder.asked, ";") != tt.wantAsked {
				t.Fatalf("got %v after %d activations, asked %q; want %d activations, asked %q", err, f.activations, finder.asked, tt.wantActivations, tt.wantAsked)
			}
		})
	}
}
