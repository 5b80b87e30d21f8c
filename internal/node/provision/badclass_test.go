package provision

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/vgview"
)

// TestOneBadClassLeavesTheOthers: one bad device class does not take the
// node down: a missing or unreadable volume group, one with a missing PV,
// a missing or failed thin pool make only the classes that use it have no
// room and refuse new volumes with ErrNoRoom (which the edge answers
// RESOURCE_EXHAUSTED, so the pod goes to another node), while the other
// classes keep working; readiness names the bad class. A volume made
// before the breakage is still found by a repeat of its Create, unless
// its volume group is gone.
func TestOneBadClassLeavesTheOthers(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		class string // the class the breakage hits
		// made is a volume of that class made before the breakage; its
		// Create repeated afterwards answers retry (nil: success).
		made  bool
		retry error
		brk   func(l *lifecycle)
		why   string
	}{
		{name: "volume group missing", class: "other", made: true, retry: ErrNoRoom,
			brk: func(l *lifecycle) { l.lvm.HideVG("vg2") }, why: `volume group "vg2" is missing`},
		{name: "volume group unreadable", class: "other", made: true,
			brk: func(l *lifecycle) {
				l.lvm.Unreadable = map[string]error{"vg2": errors.New("checksum error in metadata area")}
			}, why: `volume group "vg2" could not be read: checksum error`},
		{name: "volume group with a missing PV", class: "other", made: true,
			brk: func(l *lifecycle) { l.lvm.VGs["vg2"].MissingPVs = 1 }, why: `volume group "vg2" has 1 missing physical volume(s)`},
		{name: "thin pool missing", class: "thin",
			brk: func(l *lifecycle) {
				delete(l.lvm.Pools, "vg1/pool")
				delete(l.lvm.LVs, "vg1/pool")
			}, why: "thin pool vg1/pool is missing"},
		{name: "thin pool failed", class: "thin", made: true,
			brk: func(l *lifecycle) { l.lvm.LVs["vg1/pool"].Attr.Health = lvm.HealthFailed }, why: "thin pool vg1/pool is failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycle(t)
			if tt.made {
				l.mustVolume(t, "made-before", gib, tt.class)
			}
			room := map[string]uint64{}
			for _, c := range l.cfg.Names() {
				r, err := l.view.Capacity(l.class(t, c))
				if err != nil {
					t.Fatal(err)
				}
				room[c] = r.Available
			}
			tt.brk(l) // between calls: the fake's state is not in use
			if err := l.view.Refresh(ctx); err != nil {
				t.Fatalf("Refresh = %v; one bad class must not fail it", err)
			}

			for _, c := range l.cfg.Names() {
				r, err := l.view.Capacity(l.class(t, c))
				switch {
				case c == tt.class && !errors.Is(err, vgview.ErrClassUnavailable):
					t.Errorf("Capacity(%s) = %+v, %v; want ErrClassUnavailable", c, r, err)
				case c != tt.class && (err != nil || r.Available != room[c]):
					t.Errorf("Capacity(%s) = %+v, %v; had %d available: a healthy class changed", c, r, err, room[c])
				}
			}
			_, err := l.p.Create(ctx, l.request(t, "new-in-bad-class", gib, tt.class, nil))
			wantKind(t, err, ErrNoRoom, "cannot make volumes of device class "+tt.class, tt.why)
			if tt.made {
				_, err := l.p.Create(ctx, l.request(t, "made-before", gib, tt.class, nil))
				if tt.retry != nil {
					wantKind(t, err, tt.retry)
				} else if err != nil {
					t.Errorf("a repeat of the Create made before: %v", err)
				}
			}
			if _, err := l.p.Create(ctx, l.request(t, "new-in-good-class", gib, "fast", nil)); err != nil {
				t.Errorf("Create in healthy class fast: %v", err)
			}
			ready := l.view.Ready()
			if ready == nil || !strings.Contains(ready.Error(), "device class "+tt.class+": ") || !strings.Contains(ready.Error(), tt.why) {
				t.Errorf("Ready = %v; want it to name class %s and say %q", ready, tt.class, tt.why)
			}
			if strings.Contains(ready.Error(), "device class fast") {
				t.Errorf("Ready blames the healthy class fast: %v", ready)
			}
		})
	}
}
