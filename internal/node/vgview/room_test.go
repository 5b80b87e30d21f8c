package vgview

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Growth is checked by the class's rules as creation is: the growth must
// fit in the available capacity (spare kept; thin: overprovision ratio and
// the pool's real free space), and a size no volume of the class could
// ever have on this node is told apart from one that does not fit now.
func TestRoomToGrow(t *testing.T) {
	// testReport: vg1 20Gi with 10Gi free; class thick keeps a 1Gi spare
	// (9Gi available, 19Gi at most); class thin: pool 8Gi, ratio 2, 1Gi
	// given out, 25% written (12Gi available, 16Gi at most).
	tests := []struct {
		name     string
		class    string
		from, to uint64
		want     uint64
		err      error
	}{
		{"thick: fits", "thick", gi, 5 * gi, 5 * gi, nil},
		{"thick: rounded up to extents", "thick", gi, gi + 1, gi + ex, nil},
		{"thick: all the available room", "thick", gi, 10 * gi, 10 * gi, nil},
		{"thick: would eat into the spare", "thick", gi, 10*gi + ex, 0, ErrNoRoom},
		{"thick: more than the volume group minus the spare", "thick", gi, 19*gi + ex, 0, ErrBeyondClass},
		{"thick: already that size", "thick", 2 * gi, gi, 2 * gi, nil},
		{"thin: fits", "thin", gi, 10 * gi, 10 * gi, nil},
		{"thin: growth above the overprovision room", "thin", gi, 13*gi + ex, 0, ErrNoRoom},
		{"thin: more than pool x ratio", "thin", gi, 16*gi + ex, 0, ErrBeyondClass},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			v := New(&fakeReporter{report: testReport()}, cfg, nil)
			if err := v.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			d, _ := cfg.Class(tt.class)
			got, err := v.RoomToGrow(d, tt.from, tt.to)
			if !errors.Is(err, tt.err) || (tt.err == nil && err != nil) {
				t.Fatalf("RoomToGrow = %d, %v; want %v", got, err, tt.err)
			}
			if err == nil && got != tt.want {
				t.Errorf("size %d, want %d", got, tt.want)
			}
		})
	}
}

// A striped volume grows by whole extents per stripe, as lvextend grows
// it: the size returned is the one LVM makes, so the caller's limit_bytes
// check sees it.
func TestRoomToGrowRoundsStripedToWholeStripes(t *testing.T) {
	cfg := testConfig()
	v := New(&fakeReporter{report: testReport()}, cfg, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	d, _ := cfg.Class("thick")
	d.LVCreateOptions.Stripes = 3
	for _, tt := range []struct{ from, to, want uint64 }{
		{3 * ex, 3*ex + 1, 6 * ex},
		{3 * ex, 6 * ex, 6 * ex},
		{3 * ex, 4 * ex, 6 * ex},
	} {
		got, err := v.RoomToGrow(d, tt.from, tt.to)
		if err != nil || got != tt.want {
			t.Errorf("RoomToGrow(%d, %d) = %d, %v; want %d", tt.from, tt.to, got, err, tt.want)
		}
	}
}

func TestRoomToGrowUnavailableClass(t *testing.T) {
	cfg := testConfig()
	r := testReport()
	r.VolumeGroups[0].MissingPVs = 1
	v := New(&fakeReporter{report: r}, cfg, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	d, _ := cfg.Class("thick")
	if _, err := v.RoomToGrow(d, gi, 2*gi); !errors.Is(err, ErrClassUnavailable) {
		t.Errorf("RoomToGrow in a partial VG = %v, want ErrClassUnavailable", err)
	}
}

// A growth applied with Extended counts at once in the next room check,
// before any refresh.
func TestExtendedCountsAtOnce(t *testing.T) {
	cfg := testConfig()
	rep := &fakeReporter{report: testReport()}
	v := New(rep, cfg, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	thick, _ := cfg.Class("thick")
	thin, _ := cfg.Class("thin")
	grow := func(name string, size uint64) {
		lv, _ := v.LV("vg1", name)
		grown := lv
		grown.Size = size
		v.Extended(lv, grown)
	}
	grow("b", 4*gi)
	if c, _ := v.Capacity(thick); c.Available != 6*gi {
		t.Errorf("thick capacity after growing b by 3Gi = %d, want 6Gi", c.Available)
	}
	grow("a", 6*gi)
	// virtual room 16 - 6 = 10Gi; real room 12Gi.
	if c, _ := v.Capacity(thin); c.Available != 10*gi {
		t.Errorf("thin capacity after growing a by 5Gi = %d, want 10Gi", c.Available)
	}
	if p, _ := v.Pool("vg1", "pool"); p.ThinVolumes != 1 {
		t.Errorf("the pool counts %d thin volumes after a growth, want 1", p.ThinVolumes)
	}
	if lv, _ := v.LV("vg1", "a"); lv.Size != 6*gi {
		t.Errorf("the view holds a at %d bytes, want 6Gi", lv.Size)
	}
	if rep.calls != 1 {
		t.Errorf("Extended ran %d reports", rep.calls-1)
	}
}

// The room lock serializes one volume group, lets others run, and a
// waiter gives up with its context.
func TestLockRoom(t *testing.T) {
	v := New(&fakeReporter{report: testReport()}, testConfig(), nil)
	ctx := context.Background()
	unlock, err := v.LockRoom(ctx, "vg1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := v.LockRoom(ctx, "vg2")
	if err != nil {
		t.Fatalf("another volume group waited: %v", err)
	}
	other()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := v.LockRoom(short, "vg1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second holder of vg1: %v, want DeadlineExceeded", err)
	}
	got := make(chan func())
	go func() {
		u, err := v.LockRoom(ctx, "vg1")
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	select {
	case <-got:
		t.Fatal("vg1 taken twice")
	case <-time.After(20 * time.Millisecond):
	}
	unlock()
	(<-got)()
	if n := v.room.Size(); n != 0 {
		t.Errorf("%d lock entries left", n)
	}
}
