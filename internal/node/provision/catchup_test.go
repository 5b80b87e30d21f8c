package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// deltaPuller is a Puller and a DeltaPuller: pull is called for each
// catch-up.
type deltaPuller struct {
	pull func(src RemoteSource, dst string, sentOK bool) (DeltaResult, error)
}

func (deltaPuller) Pull(context.Context, RemoteSource, string, bool, func(uint64)) (blockcopy.Result, error) {
	return blockcopy.Result{}, errors.New("not a catch-up")
}

func (d deltaPuller) PullDelta(_ context.Context, src RemoteSource, dst string, sentOK bool, _ func(uint64)) (DeltaResult, error) {
	return d.pull(src, dst, sentOK)
}

// TestCatchUp: the target is tagged copy-pending while the catch-up
// runs and untagged only once it succeeded; a failure keeps the tag and
// its repeat converges; a target that is open, not made from the base,
// of another size, not here, not carve's or busy, or a thin one whose
// pool has not the room for its size, is refused before anything is
// written; a thin target whose pool does not zero new blocks asks for a
// digest of the whole volume.
func TestCatchUp(t *testing.T) {
	const size = 64 << 20
	const base = "node-a/vg9/carvesnap-1"
	name := volume.LVNameFor("pvc-target")
	id := volume.VolumeID("vg1", name)
	src := RemoteSource{CopyID: "c1", ID: "vg9/" + volume.LVNameFor("pvc-source"), Node: "node-a", Address: "10.0.0.1:9811", Size: size}
	mismatch := errors.New("checksum mismatch")
	target := func(change func(lv *lvm.LogicalVolume)) lvm.LogicalVolume {
		lv := lvm.LogicalVolume{VolumeGroup: "vg1", Name: name, Size: size, Tags: append(volume.VolumeTags("pvc-target", "fast", nil), volume.FromSnapshotTag(base)),
			Attr: lvm.Attributes{Type: lvm.TypeThick, Active: true}}
		if change != nil {
			change(&lv)
		}
		return lv
	}
	thin := func(lv *lvm.LogicalVolume) {
		lv.Tags = append(volume.VolumeTags("pvc-target", "thin", nil), volume.FromSnapshotTag(base))
		lv.Pool, lv.Attr.Type = "pool0", lvm.TypeThin
	}
	// pool is the 4 GiB thin pool with used percent of its data.
	pool := func(used float64, zeroes bool) *lvm.ThinPool {
		return &lvm.ThinPool{Name: "pool0", VolumeGroup: "vg1", Size: 4 << 30, DataPercent: used, ZeroNewBlocks: zeroes}
	}
	// roomFor100MiB leaves 100 MiB of the pool free.
	const roomFor100MiB = 100 * (1 - 100.0/4096)
	tests := []struct {
		name   string
		lv     *lvm.LogicalVolume
		pool   *lvm.ThinPool
		id     string
		busy   bool
		fails  int // how many pulls fail (with mismatch) before one succeeds
		kind   error
		msg    []string
		pulled int
		// sentOK is what the pull may accept: a digest of what was sent.
		sentOK bool
		// reason is the refusal's Reason: set for one no retry mends.
		reason string
	}{
		{name: "caught up", lv: ptrTo(target(nil)), id: id, pulled: 1, sentOK: true},
		{name: "made from another snapshot", lv: ptrTo(target(func(lv *lvm.LogicalVolume) {
			lv.Tags = append(volume.VolumeTags("pvc-target", "fast", nil), volume.FromSnapshotTag("node-a/vg9/carvesnap-2"))
		})), id: id, kind: ErrRefused, msg: []string{"was not made from base " + base}, reason: moveapi.ErrorNotFromBase},
		{name: "made from no snapshot", lv: ptrTo(target(func(lv *lvm.LogicalVolume) { lv.Tags = volume.VolumeTags("pvc-target", "fast", nil) })),
			id: id, kind: ErrRefused, msg: []string{"was not made from base"}, reason: moveapi.ErrorNotFromBase},
		{name: "thin, in a pool that zeroes new blocks", lv: ptrTo(target(thin)), id: id, pulled: 1, sentOK: true},
		{name: "thin, in a pool that does not zero new blocks", lv: ptrTo(target(thin)), pool: pool(0, false), id: id, pulled: 1, sentOK: false},
		{name: "thin, in a pool without room for its size", lv: ptrTo(target(thin)), pool: pool(99, true), id: id, kind: ErrNoRoom,
			msg: []string{"may write 67108864 bytes", "thin pool vg1/pool0"}},
		{name: "thin, a repeat counts its own size once", lv: ptrTo(target(func(lv *lvm.LogicalVolume) {
			thin(lv)
			lv.Tags = append(lv.Tags, volume.TagCopyPending)
		})), pool: pool(roomFor100MiB, true), id: id, pulled: 1, sentOK: true},
		{name: "after a crash: tagged already", lv: ptrTo(target(func(lv *lvm.LogicalVolume) { lv.Tags = append(lv.Tags, volume.TagCopyPending) })), id: id, pulled: 1, sentOK: true},
		{name: "a digest mismatch, then the repeat", lv: ptrTo(target(nil)), id: id, fails: 1, kind: mismatch, pulled: 2, sentOK: true},
		{name: "open", lv: ptrTo(target(func(lv *lvm.LogicalVolume) { lv.Attr.Open = true })), id: id, kind: ErrRefused, msg: []string{"is open on node node-b"}},
		{name: "another size", lv: ptrTo(target(func(lv *lvm.LogicalVolume) { lv.Size = size + 4<<20 })), id: id, kind: ErrRefused,
			msg: []string{"has 71303168 bytes", src.ID + " on node node-a has 67108864"}, reason: moveapi.ErrorSizeMismatch},
		{name: "not here", id: id, kind: ErrNotFound},
		{name: "not carve's", lv: ptrTo(target(func(lv *lvm.LogicalVolume) { lv.Tags = nil })), id: id, kind: ErrNotFound},
		{name: "of a volume group no class has", lv: ptrTo(target(nil)), id: volume.VolumeID("vg7", name), kind: ErrNotFound},
		{name: "busy", lv: ptrTo(target(nil)), id: id, busy: true, kind: ErrBusy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lvs []lvm.LogicalVolume
			if tt.lv != nil {
				lvs = append(lvs, *tt.lv)
			}
			f := newCopyLVM(tt.pool, lvs...)
			pulls := 0
			p := remoteProvisioner(t, f, deltaPuller{pull: func(got RemoteSource, dst string, sentOK bool) (DeltaResult, error) {
				pulls++
				if got != src || !strings.HasSuffix(dst, "/vg1/"+name) {
					t.Errorf("pulled %+v into %s", got, dst)
				}
				if sentOK != tt.sentOK {
					t.Errorf("the pull may accept a digest of the data sent: %v, want %v", sentOK, tt.sentOK)
				}
				if lv, err := f.GetLV(t.Context(), "vg1", name); err != nil || !volume.CopyPending(lv.Tags) {
					t.Errorf("the target during the catch-up: %+v, %v; want it tagged copy-pending", lv, err)
				}
				if pulls <= tt.fails {
					return DeltaResult{Received: 1 << 20}, mismatch
				}
				return DeltaResult{Received: 8 << 20, Sum: []byte{1}}, nil
			}})
			if tt.busy {
				unlock, err := p.Lock(name, "the test")
				if err != nil {
					t.Fatal(err)
				}
				defer unlock()
			}
			req := CatchUpRequest{VolumeID: tt.id, Source: src, Base: base}
			res, err := p.CatchUp(t.Context(), req)
			if tt.fails > 0 {
				if !errors.Is(err, tt.kind) {
					t.Fatalf("CatchUp: %v, want %v", err, tt.kind)
				}
				if lv, _ := f.GetLV(t.Context(), "vg1", name); !volume.CopyPending(lv.Tags) {
					t.Fatal("a failed catch-up took the copy-pending tag off")
				}
				if v, ok := p.cfg.View.LV("vg1", name); !ok || p.Available(&v) {
					t.Fatal("a failed catch-up left the volume available in the view")
				}
				res, err = p.CatchUp(t.Context(), req)
			}
			switch {
			case tt.kind != nil && tt.fails == 0:
				if !errors.Is(err, tt.kind) {
					t.Fatalf("CatchUp: %v, want %v", err, tt.kind)
				}
				if r := ReasonOf(err); r != tt.reason {
					t.Errorf("CatchUp: reason %q, want %q", r, tt.reason)
				}
				for _, m := range tt.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("%q does not say %q", err, m)
					}
				}
				if lv, gerr := f.GetLV(t.Context(), "vg1", name); gerr == nil && volume.CopyPending(lv.Tags) {
					t.Error("a refused catch-up tagged the target")
				}
			case err != nil:
				t.Fatalf("CatchUp: %v", err)
			default:
				if res.Received != 8<<20 {
					t.Errorf("received %d", res.Received)
				}
				lv, _ := f.GetLV(t.Context(), "vg1", name)
				if volume.CopyPending(lv.Tags) {
					t.Error("the caught-up target still carries copy-pending")
				}
				if v, ok := p.cfg.View.LV("vg1", name); !ok || volume.CopyPending(v.Tags) {
					t.Errorf("the view's target %+v still carries copy-pending", v)
				}
			}
			if pulls != tt.pulled {
				t.Errorf("%d pulls, want %d", pulls, tt.pulled)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// catchUpSize is the size of a catch-up source's volume.
const catchUpSize = 64 << 20

// catchUpSource is a catch-up's source on node-b: the active thin volume
// of pvc-source in vg1's pool0, its active snapshot seed, and their IDs.
type catchUpSource struct {
	vol, seed lvm.LogicalVolume
	id, base  string
}

func newCatchUpSource() catchUpSource {
	name, snapLV := volume.LVNameFor("pvc-source"), volume.SnapshotLVNameFor("seed")
	return catchUpSource{
		vol: lvm.LogicalVolume{VolumeGroup: "vg1", Name: name, Size: catchUpSize, Tags: volume.VolumeTags("pvc-source", "thin", nil), Pool: "pool0",
			Attr: lvm.Attributes{Type: lvm.TypeThin, Active: true}},
		seed: lvm.LogicalVolume{VolumeGroup: "vg1", Name: snapLV, Size: catchUpSize, Tags: volume.SnapshotTags("seed", "thin", name), Pool: "pool0",
			Attr: lvm.Attributes{Type: lvm.TypeThin, Active: true}},
		id:   volume.VolumeID("vg1", name),
		base: volume.SnapshotID("node-b", "vg1", snapLV),
	}
}

// TestDeltaSource: the source of a catch-up is a carve volume of this
// node, not open and not being copied into, with the base one of its own
// snapshots here; ReadDelta fails a read after which the volume is open.
func TestDeltaSource(t *testing.T) {
	const size = catchUpSize
	src := newCatchUpSource()
	name, snapLV, id, base := src.vol.Name, src.seed.Name, src.id, src.base
	vol := func(change func(lv *lvm.LogicalVolume)) []lvm.LogicalVolume {
		lv := src.vol
		lv.Tags = slices.Clone(lv.Tags)
		if change != nil {
			change(&lv)
		}
		snap := src.seed
		snap.Attr.Active = false
		other := lvm.LogicalVolume{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor("other"), Size: size,
			Tags: volume.SnapshotTags("other", "thin", volume.LVNameFor("pvc-other")), Pool: "pool0", Attr: lvm.Attributes{Type: lvm.TypeThin}}
		return []lvm.LogicalVolume{lv, snap, other}
	}
	tests := []struct {
		name       string
		lvs        []lvm.LogicalVolume
		base       string
		openDuring bool
		kind       error
		msg        string
		reason     string
	}{
		{name: "readable", lvs: vol(nil), base: base},
		{name: "open", lvs: vol(func(lv *lvm.LogicalVolume) { lv.Attr.Open = true }), base: base, kind: ErrRefused, msg: "is open on node node-b"},
		{name: "opened while read", lvs: vol(nil), base: base, openDuring: true, kind: ErrRefused, msg: "was opened"},
		{name: "still copied into", lvs: vol(func(lv *lvm.LogicalVolume) { lv.Tags = append(lv.Tags, volume.TagCopyPending) }), base: base, kind: ErrRefused, msg: "being copied into", reason: moveapi.ErrorSourceCopyPending},
		{name: "a base that overflowed", lvs: func() []lvm.LogicalVolume {
			l := vol(nil)
			l[1].Attr.SnapshotInvalid = true
			return l
		}(), base: base, kind: ErrRefused, msg: "ran out", reason: moveapi.ErrorBaseOverflowed},
		{name: "a base of another volume", lvs: vol(nil), base: volume.SnapshotID("node-b", "vg1", volume.SnapshotLVNameFor("other")), kind: ErrNotFound, msg: "not of " + id},
		{name: "a base of another node", lvs: vol(nil), base: volume.SnapshotID("node-a", "vg1", snapLV), kind: ErrNotFound, msg: "node node-a"},
		{name: "a base that is gone", lvs: vol(nil), base: volume.SnapshotID("node-b", "vg1", volume.SnapshotLVNameFor("gone")), kind: ErrNotFound},
		{name: "a volume that is gone", lvs: vol(nil)[1:], base: base, kind: ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCopyLVM(nil, tt.lvs...)
			p := remoteProvisioner(t, f, nil)
			got, err := p.DeltaSize(t.Context(), id, tt.base)
			if tt.kind == nil || tt.openDuring {
				if err != nil || got != size {
					t.Fatalf("DeltaSize: %d, %v", got, err)
				}
			} else if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.msg) || ReasonOf(err) != tt.reason {
				t.Fatalf("DeltaSize: %v (reason %q), want %v saying %q (reason %q)", err, ReasonOf(err), tt.kind, tt.msg, tt.reason)
			}
			reads := 0
			err = p.ReadDelta(t.Context(), id, tt.base, func(d Delta) error {
				v, b, n := d.Volume, d.Base, d.Size
				reads++
				if !strings.HasSuffix(v, "/vg1/"+name) || !strings.HasSuffix(b, "/vg1/"+snapLV) || n != size {
					t.Errorf("read %s against %s, %d bytes", v, b, n)
				}
				if tt.openDuring {
					f.Mu.Lock()
					f.LVs[tt.lvs[0].VolumeGroup+"/"+tt.lvs[0].Name].Attr.Open = true
					f.Mu.Unlock()
				}
				return nil
			})
			if tt.kind == nil {
				if err != nil || reads != 1 {
					t.Fatalf("ReadDelta: %v (%d reads)", err, reads)
				}
				return
			}
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("ReadDelta: %v, want %v saying %q", err, tt.kind, tt.msg)
			}
			if reads != 0 && !tt.openDuring {
				t.Error("a refused source was read")
			}
		})
	}
}

// changeFinder is a ChangeFinder that answers set or err and records
// what it was asked; its pools are active when poolActive is set.
type changeFinder struct {
	set        changemap.Set
	err        error
	asked      []string
	poolActive bool
}

func (c *changeFinder) ThinChangesOfIDs(_ context.Context, vg, pool string, baseID, volID uint64) (changemap.Set, error) {
	c.asked = append(c.asked, fmt.Sprintf("thin ids %s/%s %d..%d", vg, pool, baseID, volID))
	return c.set, c.err
}

func (c *changeFinder) ThinMappedOfID(_ context.Context, vg, pool string, id uint64) (changemap.Set, error) {
	c.asked = append(c.asked, fmt.Sprintf("mapped id %s/%s %d", vg, pool, id))
	return c.set, c.err
}

func (c *changeFinder) PoolActive(string, string) bool { return c.poolActive }

func (c *changeFinder) ThinChanges(_ context.Context, vg, pool, base, vol string) (changemap.Set, error) {
	c.asked = append(c.asked, "thin "+vg+"/"+pool+" "+base+".."+vol)
	return c.set, c.err
}

func (c *changeFinder) ThinMapped(_ context.Context, vg, pool, vol string) (changemap.Set, error) {
	c.asked = append(c.asked, "mapped "+vg+"/"+pool+" "+vol)
	return c.set, c.err
}

func (c *changeFinder) SnapshotChanges(_ context.Context, vg, snap string) (changemap.Set, error) {
	c.asked = append(c.asked, "cow "+vg+"/"+snap)
	return c.set, c.err
}

// TestReadDeltaChanges: a thin volume and base of one pool get their
// changes from thin_delta, a thick volume and its copy-on-write base
// from the exception table; any other pair, a node without a
// ChangeFinder, and a failure of the metadata path fall back to the
// compare, saying why.
func TestReadDeltaChanges(t *testing.T) {
	const size = catchUpSize
	src := newCatchUpSource()
	name, snapLV, id, base := src.vol.Name, src.seed.Name, src.id, src.base
	found := changemap.Set{{Off: 1 << 20, Len: 64 << 10}}
	thinVol, thinSnap := src.vol, src.seed
	thickVol := thinVol
	thickVol.Pool, thickVol.Attr.Type, thickVol.Tags = "", lvm.TypeThick, volume.VolumeTags("pvc-source", "fast", nil)
	cowSnap := thinSnap
	cowSnap.Pool, cowSnap.Origin, cowSnap.Attr.Type, cowSnap.Tags = "", name, lvm.TypeSnapshot, append(volume.SnapshotTags("seed", "fast", name), volume.SizeTag(size))
	otherPool := thinSnap
	otherPool.Pool = "pool1"
	thinOfThick := thinSnap
	tests := []struct {
		name       string
		vol, snap  lvm.LogicalVolume
		finder     *changeFinder
		wantMethod string
		wantAsked  string
		wantWhy    string
	}{
		{"thin in one pool", thinVol, thinSnap, &changeFinder{set: found}, MapThinDelta, "thin vg1/pool0 " + snapLV + ".." + name, ""},
		{"thick with a COW base", thickVol, cowSnap, &changeFinder{set: found}, MapCOW, "cow vg1/" + snapLV, ""},
		{"nothing changed", thinVol, thinSnap, &changeFinder{}, MapThinDelta, "thin vg1/pool0 " + snapLV + ".." + name, ""},
		{"thin_delta fails", thinVol, thinSnap, &changeFinder{err: errors.New("exit status 1")}, DeltaCompare, "thin vg1/pool0 " + snapLV + ".." + name, "thin_delta failed: exit status 1"},
		{"the exception table cannot be read", thickVol, cowSnap, &changeFinder{err: errors.New("not a store")}, DeltaCompare, "cow vg1/" + snapLV, "cow_exceptions failed: not a store"},
		{"pools differ", thinVol, otherPool, &changeFinder{}, DeltaCompare, "", `in thin pool "pool1", the volume in "pool0"`},
		{"a thick volume with a thin base", thickVol, thinOfThick, &changeFinder{}, DeltaCompare, "", "no metadata maps the changes of a thick LV (origin \"\") since a thin base"},
		{"no finder", thinVol, thinSnap, nil, DeltaCompare, "", "names no changes from device-mapper metadata"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCopyLVM(nil, tt.vol, tt.snap)
			p := remoteProvisioner(t, f, nil)
			if tt.finder != nil {
				p.cfg.Changes = tt.finder
			}
			var got Delta
			if err := p.ReadDelta(t.Context(), id, base, func(d Delta) error { got = d; return nil }); err != nil {
				t.Fatal(err)
			}
			if got.Method != tt.wantMethod || !strings.Contains(got.Fallback, tt.wantWhy) || (tt.wantWhy == "") != (got.Fallback == "") {
				t.Errorf("method %q (fallback %q), want %q (saying %q)", got.Method, got.Fallback, tt.wantMethod, tt.wantWhy)
			}
			wantSet := tt.finder != nil && tt.finder.err == nil && tt.wantMethod != DeltaCompare
			if wantSet && !slices.Equal(got.Changed, tt.finder.set) || !wantSet && got.Changed != nil {
				t.Errorf("changed %v", got.Changed)
			}
			if tt.finder != nil && strings.Join(tt.finder.asked, ";") != tt.wantAsked {
				t.Errorf("asked %q, want %q", tt.finder.asked, tt.wantAsked)
			}
		})
	}
}
