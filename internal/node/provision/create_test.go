package provision

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// TestCreate: the size Create makes from the asked range (whole extents,
// a filesystem's minimum, the class's spare and overprovision ratio) and
// the LV it makes: in the class's volume group (and pool), tagged with the
// volume's name and class. A refused Create makes nothing.
func TestCreate(t *testing.T) {
	tests := []struct {
		name     string
		class    string
		fs       string // "" is ext4; "block" a raw-block volume
		rng      Range
		kind     error
		msg      []string
		wantSize int64
		wantVG   string
	}{
		{name: "default class, 1 GiB", class: "fast", rng: Range{Required: gib}, wantSize: gib, wantVG: "vg1"},
		{name: "raw block", class: "fast", fs: "block", rng: Range{Required: gib}, wantSize: gib, wantVG: "vg1"},
		{name: "xfs", class: "fast", fs: "xfs", rng: Range{Required: gib}, wantSize: gib, wantVG: "vg1"},
		{name: "other class", class: "other", rng: Range{Required: gib}, wantSize: gib, wantVG: "vg2"},
		{name: "required above limit", class: "fast", rng: Range{Required: 2 * gib, Limit: gib}, kind: ErrInvalid, msg: []string{"exceeds limit_bytes"}},
		{name: "negative", class: "fast", rng: Range{Required: -1}, kind: ErrInvalid, msg: []string{"negative"}},
		{name: "rounded up past the limit", class: "fast", rng: Range{Required: 5 * mib, Limit: 6 * mib}, kind: ErrOutOfRange, msg: []string{"8388608", "limit_bytes 6291456"}},
		{name: "rounded up to extents", class: "fast", rng: Range{Required: 5 * mib}, wantSize: 8 * mib, wantVG: "vg1"},
		{name: "no capacity range", class: "fast", wantSize: volume.DefaultVolumeSize, wantVG: "vg1"},
		{name: "only a small limit", class: "fast", rng: Range{Limit: 100*mib + 1}, wantSize: 100 * mib, wantVG: "vg1"},
		{name: "limit below one extent", class: "fast", rng: Range{Limit: mib}, kind: ErrOutOfRange, msg: []string{"smaller than one extent"}},
		{name: "exactly what is left after the spare", class: "fast", rng: Range{Required: 5 * gib}, wantSize: 5 * gib, wantVG: "vg1"},
		{name: "one extent into the spare", class: "fast", rng: Range{Required: 5*gib + 1}, kind: ErrNoRoom, msg: []string{"after a spare of 1073741824"}},
		{name: "xfs below its minimum grows to 300 MiB", class: "fast", fs: "xfs", rng: Range{Required: 100 * mib}, wantSize: 300 * mib, wantVG: "vg1"},
		{name: "xfs limited below its minimum", class: "fast", fs: "xfs", rng: Range{Required: 100 * mib, Limit: 200 * mib}, kind: ErrOutOfRange, msg: []string{"limit_bytes 209715200", "xfs"}},
		{name: "ext4 has no such minimum", class: "fast", fs: "ext4", rng: Range{Required: 100 * mib}, wantSize: 100 * mib, wantVG: "vg1"},
		{name: "thin", class: "thin", rng: Range{Required: gib}, wantSize: gib, wantVG: "vg1"},
		{name: "thin up to the ratio", class: "thin", rng: Range{Required: 8 * gib}, wantSize: 8 * gib, wantVG: "vg1"},
		{name: "thin beyond the ratio", class: "thin", rng: Range{Required: 8*gib + 1}, kind: ErrNoRoom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycle(t)
			req := l.request(t, "pvc-1", 0, tt.class, nil)
			req.Range = tt.rng
			switch tt.fs {
			case "block":
				req.FSType, req.Block = "", true
			case "":
			default:
				req.FSType = tt.fs
			}
			lv, err := l.p.Create(context.Background(), req)
			if tt.kind != nil {
				wantKind(t, err, tt.kind, tt.msg...)
				if n := len(l.view.Volumes()); n != 0 {
					t.Errorf("a failed Create left %d volumes", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if lv.VolumeGroup != tt.wantVG || lv.Name != volume.LVNameFor("pvc-1") {
				t.Errorf("Create made %s/%s", lv.VolumeGroup, lv.Name)
			}
			if int64(lv.Size) != tt.wantSize {
				t.Errorf("size = %d, want %d", lv.Size, tt.wantSize)
			}
			got, err := l.lvm.GetLV(context.Background(), lv.VolumeGroup, lv.Name)
			if err != nil {
				t.Fatalf("the LV is not in LVM: %v", err)
			}
			class, _ := volume.ClassFromTags(got.Tags)
			name, whole, _ := volume.VolumeNameFromTags(got.Tags)
			if name != "pvc-1" || !whole || class != tt.class || !volume.IsCarve(got.Tags) {
				t.Errorf("tags %v", got.Tags)
			}
			if (class == "thin") != (got.Pool == "pool") {
				t.Errorf("class %s made an LV in pool %q", class, got.Pool)
			}
		})
	}
}

// TestCreateIdempotent: a repeat of a Create that fits the volume made
// (the same, a smaller ask, after a restart) is that volume; a larger
// ask, a limit below its size or another class is ErrMismatch; none makes
// another LV.
func TestCreateIdempotent(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	id := l.mustVolume(t, "pvc-1", gib, "fast")
	tests := []struct {
		name    string
		class   string
		rng     Range
		restart bool
		kind    error
		msg     []string
	}{
		{name: "same request", class: "fast", rng: Range{Required: gib}},
		{name: "smaller request fits", class: "fast", rng: Range{Required: gib / 2}},
		{name: "after a restart", class: "fast", rng: Range{Required: gib}, restart: true},
		{name: "larger", class: "fast", rng: Range{Required: 2 * gib}, kind: ErrMismatch, msg: []string{"1073741824 bytes"}},
		{name: "limit below the size", class: "fast", rng: Range{Limit: gib / 2}, kind: ErrMismatch},
		{name: "other class", class: "thin", rng: Range{Required: gib}, kind: ErrMismatch, msg: []string{`"fast"`, `"thin"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.restart {
				l.restart(t)
			}
			req := l.request(t, "pvc-1", 0, tt.class, nil)
			req.Range = tt.rng
			lv, err := l.p.Create(ctx, req)
			if tt.kind != nil {
				wantKind(t, err, tt.kind, tt.msg...)
			} else if err != nil || volume.VolumeID(lv.VolumeGroup, lv.Name) != id {
				t.Errorf("Create = %v, %v; want volume %s", lv, err, id)
			}
			if n := len(l.lvm.LVs); n != 2 { // the pool and the one volume
				t.Errorf("%d LVs in LVM, want the pool and one volume", n)
			}
		})
	}
}

// TestCreateStaleView: an LV the view does not know yet (made outside the
// view, or the view is stale) is found through lvcreate's "already
// exists"; one of that name that carries another volume's name tag is not
// it.
func TestCreateStaleView(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	name := "pvc-made-elsewhere"
	if _, err := l.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: volume.LVNameFor(name), Size: uint64(gib),
		Tags: []string{volume.TagOwner, volume.VolumeTag(name), volume.TagClassPrefix + "fast"}}); err != nil {
		t.Fatal(err)
	}
	lv, err := l.p.Create(ctx, l.request(t, name, gib, "fast", nil))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if lv.VolumeGroup != "vg1" || lv.Name != volume.LVNameFor(name) {
		t.Errorf("Create found %s/%s", lv.VolumeGroup, lv.Name)
	}
	if _, ok := l.view.LV("vg1", volume.LVNameFor(name)); !ok {
		t.Error("the view did not learn the LV")
	}

	clash := "pvc-clash"
	if _, err := l.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: volume.LVNameFor(clash), Size: uint64(gib),
		Tags: []string{volume.TagOwner, volume.VolumeTag("someone-else"), volume.TagClassPrefix + "fast"}}); err != nil {
		t.Fatal(err)
	}
	_, err = l.p.Create(ctx, l.request(t, clash, gib, "fast", nil))
	wantKind(t, err, ErrMismatch, "someone-else")
}

// TestCreateRecordsClaim: with csi-provisioner's --extra-create-metadata
// the LV names its claim, and the volume is found again on a retry after
// a restart.
func TestCreateRecordsClaim(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	pv := "pvc-7d3c1a0e-0b6f-4f5e-9d1a-3c2b1a0f9e8d"
	req := l.request(t, pv, gib, "fast", nil)
	req.Params = map[string]string{volume.ParamPVCNamespace: "db", volume.ParamPVCName: "data-pg-0", volume.ParamPVName: pv}
	made, err := l.p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	lv, err := l.lvm.GetLV(ctx, made.VolumeGroup, made.Name)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{volume.TagOwner, "carve.dev/name=" + pv, "carve.dev/class=fast", "carve.dev/pvc=db/data-pg-0"}
	if !slices.Equal(lv.Tags, want) {
		t.Errorf("tags %q, want %q", lv.Tags, want)
	}
	if c, ok := volume.ClaimFromTags(lv.Tags); !ok || c.String() != "db/data-pg-0" {
		t.Errorf("ClaimFromTags = %v, %v", c, ok)
	}

	l.restart(t)
	again, err := l.p.Create(ctx, req)
	if err != nil || volume.VolumeID(again.VolumeGroup, again.Name) != volume.VolumeID("vg1", volume.LVNameFor(pv)) {
		t.Errorf("retried Create(%s) = %v, %v", pv, again, err)
	}
	if vols := l.view.Volumes(); len(vols) != 1 || !l.p.Available(&vols[0]) {
		t.Errorf("the view lists %v; want the volume, available", vols)
	}
	if n := len(l.lvm.LVs); n != 2 { // the pool and the volume
		t.Errorf("%d LVs in LVM, want the pool and the volume", n)
	}
}

// TestCreateRoomFreedOutsideCarve: the view saw an LV made outside carve
// that has since been removed; Create reads LVM again instead of
// answering ErrNoRoom from the stale view (seen in the guest bench, where
// raw lvcreate/lvremove ran beside the node agent).
func TestCreateRoomFreedOutsideCarve(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	if _, err := l.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: "outside", Size: 5 << 30}); err != nil {
		t.Fatal(err)
	}
	if err := l.view.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.lvm.RemoveLV(ctx, "vg1", "outside"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.p.Create(ctx, l.request(t, "pvc-after-free", 4*gib, "fast", nil)); err != nil {
		t.Fatalf("Create after space was freed outside carve: %v", err)
	}
	// Still too big after a fresh read.
	_, err := l.p.Create(ctx, l.request(t, "pvc-too-big", 4*gib, "fast", nil))
	wantKind(t, err, ErrNoRoom)
}

// TestCreateBusy: a Create while the volume's lock is held is ErrBusy,
// as is a Delete; once it is released the Create goes on.
func TestCreateBusy(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	if !l.locks.TryAcquire(volume.LVNameFor("pvc-1")) {
		t.Fatal("lock taken")
	}
	_, err := l.p.Create(ctx, l.request(t, "pvc-1", gib, "fast", nil))
	wantKind(t, err, ErrBusy, "in progress")
	wantKind(t, l.deleteVolume(t, volume.VolumeID("vg1", volume.LVNameFor("pvc-1"))), ErrBusy)
	l.locks.Release(volume.LVNameFor("pvc-1"))
	if _, err := l.p.Create(ctx, l.request(t, "pvc-1", gib, "fast", nil)); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

// TestCreateLVMErrors: lvcreate's errors come back wrapped, with the
// lvm package's class kept for the edge's mapper.
func TestCreateLVMErrors(t *testing.T) {
	for _, want := range []error{lvm.ErrInsufficientSpace, lvm.ErrInvalidArgument, context.DeadlineExceeded, errors.New("lvm crashed")} {
		t.Run(want.Error(), func(t *testing.T) {
			l := newLifecycle(t)
			l.lvm.FailNext = want
			_, err := l.p.Create(context.Background(), l.request(t, "pvc-1", gib, "fast", nil))
			if !errors.Is(err, want) {
				t.Errorf("Create = %v, want it to wrap %v", err, want)
			}
			if n := len(l.view.Volumes()); n != 0 {
				t.Errorf("a failed Create left %d volumes", n)
			}
		})
	}
}
