package lvm

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestActivateLV: an inactive LV is activated with one lvchange of that LV
// alone (with --ignoreactivationskip only when it carries the skip flag),
// and the result is read back; an active one runs no lvchange.
func TestActivateLV(t *testing.T) {
	tests := []struct {
		name     string
		fixture  string
		vg, lv   string
		attr     string // lv_attr set before the call; empty keeps the fixture's
		filter   bool   // lvm.conf's volume_list keeps the LV inactive
		wantArgs []string
		wantCmds []string
		text     string // expected error text; empty means success
	}{
		{name: "inactive thick LV", fixture: "fullreport-thin.json", vg: "rec-thin", lv: "thick1", attr: "-wi-------",
			wantArgs: []string{"lvchange", "--config", "activation/monitoring=0", "--activate", "y", "rec-thin/thick1"},
			wantCmds: []string{"lvs", "lvchange", "lvs"}},
		{name: "inactive thin LV: its pool comes with it", fixture: "fullreport-thin.json", vg: "rec-thin", lv: "thin1", attr: "Vwi---tz--",
			wantArgs: []string{"lvchange", "--config", "activation/monitoring=0", "--activate", "y", "rec-thin/thin1"},
			wantCmds: []string{"lvs", "lvchange", "lvs"}},
		{name: "thin snapshot with the activation-skip flag", fixture: "fullreport-thin.json", vg: "rec-thin", lv: "snap1", attr: "Vwi---tz-k",
			wantArgs: []string{"lvchange", "--config", "activation/monitoring=0", "--activate", "y", "--ignoreactivationskip", "rec-thin/snap1"},
			wantCmds: []string{"lvs", "lvchange", "lvs"}},
		{name: "active already: nothing runs but the read", fixture: "fullreport-thin.json", vg: "rec-thin", lv: "thin2",
			wantCmds: []string{"lvs"}},
		{name: "lvchange succeeds but the LV stays inactive", fixture: "fullreport-thin.json", vg: "rec-thin", lv: "thick1", attr: "-wi-------",
			filter: true, wantCmds: []string{"lvs", "lvchange", "lvs"}, text: "volume_list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, tt.fixture)
			if tt.attr != "" {
				f.setAttr(tt.vg, tt.lv, tt.attr)
			}
			f.activationFilter = tt.filter
			lv, err := f.client().ActivateLV(context.Background(), tt.vg, tt.lv)
			if got := f.commands(); !slices.Equal(got, tt.wantCmds) {
				t.Errorf("commands %v, want %v", got, tt.wantCmds)
			}
			if tt.wantArgs != nil {
				i := slices.IndexFunc(f.calls, func(c []string) bool { return c[0] == "lvchange" })
				if i < 0 || !slices.Equal(f.calls[i], tt.wantArgs) {
					t.Errorf("lvchange argv %v, want %v", f.calls, tt.wantArgs)
				}
			}
			if tt.text != "" {
				if err == nil || !strings.Contains(err.Error(), tt.text) {
					t.Fatalf("error %v, want one that says %q", err, tt.text)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !lv.Attr.Active || lv.Name != tt.lv || lv.Path != "/dev/"+tt.vg+"/"+tt.lv {
				t.Errorf("result %+v, want the active LV with its device path", lv)
			}
		})
	}
}

// TestActivateLVFailures: what is missing is ErrNotFound without an
// lvchange; a failed lvchange is explained from LVM's state.
func TestActivateLVFailures(t *testing.T) {
	tests := []struct {
		name    string
		fixture string
		vg, lv  string
		fail    *output // lvchange's answer; nil lets the fake activate
		prepare func(f *fakeLVM)
		want    error
		text    string
		lvchg   bool // whether lvchange ran
	}{
		{name: "LV missing", fixture: "fullreport-thin.json", vg: "rec-thin", lv: "nosuchlv", want: ErrNotFound},
		{name: "VG missing", fixture: "fullreport-thin.json", vg: "nosuchvg", lv: "thin1", want: ErrNotFound},
		{name: "LV removed between the read and lvchange", fixture: "fullreport-thin.json", vg: "rec-thin", lv: "thick1",
			prepare: func(f *fakeLVM) {
				f.setAttr("rec-thin", "thick1", "-wi-------")
				f.mutate = func(args []string) output {
					f.mu.Lock()
					defer f.mu.Unlock()
					f.lvs = slices.DeleteFunc(f.lvs, func(lv jsonLV) bool { return lv.Name == "thick1" })
					return output{ExitCode: 5}
				}
			}, want: ErrNotFound, text: "does not exist", lvchg: true},
		{name: "a PV of the VG is missing", fixture: "fullreport-missing-pv.json", vg: "rec-partial", lv: "whole",
			fail: &output{ExitCode: 5, Stderr: []byte("  Refusing activation of partial LV rec-partial/whole.  Use '--activationmode partial' to override.")},
			text: "physical volume(s) of the volume group are missing", lvchg: true},
		{name: "activated from outside meanwhile: success", fixture: "fullreport-thin.json", vg: "rec-thin", lv: "thick1",
			prepare: func(f *fakeLVM) {
				f.setAttr("rec-thin", "thick1", "-wi-------")
				f.mutate = func(args []string) output {
					f.setAttr("rec-thin", "thick1", "-wi-a-----")
					return output{ExitCode: 5}
				}
			}, lvchg: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, tt.fixture)
			if tt.prepare != nil {
				tt.prepare(f)
			}
			if tt.fail != nil {
				f.mutate = failWith(*tt.fail)
			}
			lv, err := f.client().ActivateLV(context.Background(), tt.vg, tt.lv)
			if ran := slices.Contains(f.commands(), "lvchange"); ran != tt.lvchg {
				t.Errorf("lvchange ran: %t, want %t (commands %v)", ran, tt.lvchg, f.commands())
			}
			if tt.want == nil && tt.text == "" {
				if err != nil || !lv.Attr.Active {
					t.Fatalf("ActivateLV = %+v, %v; want the active LV", lv, err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("error %v, want %v", err, tt.want)
			}
			if tt.want == nil {
				for _, kind := range []error{ErrNotFound, ErrAlreadyExists, ErrInsufficientSpace, ErrInvalidArgument, ErrInUse} {
					if errors.Is(err, kind) {
						t.Errorf("error %v is classified %v", err, kind)
					}
				}
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Errorf("error %q does not say %q", err, tt.text)
			}
		})
	}
}

func TestActivateLVInvalidNameRunsNothing(t *testing.T) {
	for _, name := range [][2]string{{"-vg", "lv"}, {"vg", "--all"}, {"vg", "a/b"}} {
		f := loadFake(t, "fullreport-thin.json")
		if _, err := f.client().ActivateLV(context.Background(), name[0], name[1]); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ActivateLV(%q, %q) = %v, want ErrInvalidArgument", name[0], name[1], err)
		}
		if got := f.commands(); len(got) != 0 {
			t.Errorf("ActivateLV(%q, %q) ran %v", name[0], name[1], got)
		}
	}
}
