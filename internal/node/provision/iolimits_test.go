package provision

import (
	"context"
	"slices"
	"testing"

	"github.com/carve-csi/carve/internal/volume"
)

// TestSetIOLimits: SetIOLimits records the limits in the LV's tags and in
// the view: parameters merge over what the volume has, "max" lifts one,
// a repeat changes nothing.
func TestSetIOLimits(t *testing.T) {
	l := newLifecycle(t)
	id := l.mustVolume(t, "pvc-1", gib, "fast")
	vg, name, _ := volume.ParseVolumeID(id)
	steps := []struct {
		params   map[string]string
		wantTags []string
		want     volume.IOLimits
	}{
		{map[string]string{volume.ParamWriteBytesPerSecond: "10Mi"}, []string{"carve.dev/wbps=10485760"}, volume.IOLimits{WriteBPS: 10 << 20}},
		{map[string]string{volume.ParamReadIOPS: "300"}, []string{"carve.dev/riops=300", "carve.dev/wbps=10485760"}, volume.IOLimits{WriteBPS: 10 << 20, ReadIOPS: 300}},
		{map[string]string{volume.ParamReadIOPS: "300"}, []string{"carve.dev/riops=300", "carve.dev/wbps=10485760"}, volume.IOLimits{WriteBPS: 10 << 20, ReadIOPS: 300}},
		{map[string]string{volume.ParamWriteBytesPerSecond: "max", volume.ParamReadIOPS: "max"}, nil, volume.IOLimits{}},
	}
	for i, s := range steps {
		limits, err := l.p.SetIOLimits(context.Background(), vg, name, s.params)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if limits != s.want {
			t.Errorf("step %d: limits %+v, want %+v", i, limits, s.want)
		}
		tags, _ := l.lvm.LVTags(vg, name)
		got := slices.DeleteFunc(slices.Clone(tags), func(t string) bool { return !volume.IsIOLimitTag(t) })
		slices.Sort(got)
		if !slices.Equal(got, s.wantTags) {
			t.Errorf("step %d: limit tags %v, want %v", i, got, s.wantTags)
		}
		if lv, _ := l.view.FindLV(name); volume.IOLimitsFromTags(lv.Tags) != volume.IOLimitsFromTags(tags) {
			t.Errorf("step %d: the view holds %v, the LV %v", i, lv.Tags, tags)
		}
	}
}

// TestSetIOLimitsRefusals: a parameter that is not a limit or a value out
// of bounds is ErrInvalid, a volume that is not here or not a carve
// volume ErrNotFound, one with an operation in flight ErrBusy; none
// changes the tags. No parameters change nothing and succeed.
func TestSetIOLimitsRefusals(t *testing.T) {
	l := newLifecycle(t)
	id := l.mustVolume(t, "pvc-1", gib, "thin")
	vg, name, _ := volume.ParseVolumeID(id)
	snap := l.mustSnapshot(t, "snap-1", id)
	for _, tc := range []struct {
		name, lv string
		params   map[string]string
		busy     bool
		kind     error
		msg      []string
	}{
		{name: "unknown key", lv: name, params: map[string]string{"XXX_FakeKey": "v"}, kind: ErrInvalid,
			msg: []string{"XXX_FakeKey", volume.ParamReadBytesPerSecond}},
		{name: "bad value", lv: name, params: map[string]string{volume.ParamWriteIOPS: "fast"}, kind: ErrInvalid,
			msg: []string{volume.ParamWriteIOPS, `"fast"`, "whole number"}},
		{name: "no such LV", lv: volume.LVNameFor("gone"), params: map[string]string{volume.ParamReadIOPS: "1"}, kind: ErrNotFound, msg: []string{"does not exist"}},
		{name: "a snapshot", lv: snap.Name, params: map[string]string{volume.ParamReadIOPS: "1"}, kind: ErrNotFound, msg: []string{"not a carve volume"}},
		{name: "busy", lv: name, params: map[string]string{volume.ParamReadIOPS: "1"}, busy: true, kind: ErrBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.busy {
				if !l.locks.TryAcquire(tc.lv) {
					t.Fatal("lock taken")
				}
				defer l.locks.Release(tc.lv)
			}
			_, err := l.p.SetIOLimits(context.Background(), vg, tc.lv, tc.params)
			wantKind(t, err, tc.kind, tc.msg...)
		})
	}
	for _, lv := range []string{name, snap.Name} {
		if tags, _ := l.lvm.LVTags(vg, lv); slices.ContainsFunc(tags, volume.IsIOLimitTag) {
			t.Errorf("a refused SetIOLimits left tags %v on %s", tags, lv)
		}
	}
	if _, err := l.p.SetIOLimits(context.Background(), vg, name, nil); err != nil {
		t.Errorf("SetIOLimits without parameters: %v", err)
	}
}
