package lvm

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestReportOfNamedVolumeGroups: a report can be limited to carve's volume
// groups, so that one LVM cannot read (not carve's, or broken) does not fail
// it, and a report of one volume group tells "missing" from "unreadable".
func TestReportOfNamedVolumeGroups(t *testing.T) {
	tests := []struct {
		name     string
		vgs      []string
		readErr  bool // every read fails (exit 5), vgs included
		wantVGs  []string
		wantErr  error // nil with wantFail: an unclassified error
		wantFail bool
		wantCmds []string
	}{
		{name: "all", wantVGs: []string{"rec-empty", "rec-thick"}, wantCmds: []string{"fullreport"}},
		{name: "one named", vgs: []string{"rec-thick"}, wantVGs: []string{"rec-thick"}, wantCmds: []string{"fullreport"}},
		{name: "two named", vgs: []string{"rec-thick", "rec-empty"}, wantVGs: []string{"rec-empty", "rec-thick"}, wantCmds: []string{"fullreport"}},
		{name: "one named, missing", vgs: []string{"nosuchvg"}, wantErr: ErrVolumeGroupNotFound, wantFail: true,
			wantCmds: []string{"fullreport", "vgs"}},
		{name: "one named, unreadable", vgs: []string{"rec-thick"}, readErr: true, wantFail: true,
			wantCmds: []string{"fullreport", "vgs"}},
		{name: "two named, one missing: the caller asks per VG", vgs: []string{"rec-thick", "nosuchvg"}, wantFail: true,
			wantCmds: []string{"fullreport"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFake(t, "fullreport-thick.json")
			if tt.readErr {
				f.readErr = &output{ExitCode: 5, Stderr: []byte("  Metadata on /dev/loop7 at 4608 has wrong VG name")}
			}
			r, err := f.client().Report(context.Background(), tt.vgs...)
			if got := f.commands(); !slices.Equal(got, tt.wantCmds) {
				t.Errorf("commands %v, want %v", got, tt.wantCmds)
			}
			if args := f.calls[0]; !slices.Equal(args[len(args)-len(tt.vgs):], tt.vgs) || args[len(args)-len(tt.vgs)-1] != "pvseg_size<0" {
				t.Errorf("fullreport argv %v does not end with the named VGs %v", args, tt.vgs)
			}
			if tt.wantFail {
				if err == nil {
					t.Fatal("no error")
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("error %v, want %v", err, tt.wantErr)
				}
				if tt.wantErr == nil && errors.Is(err, ErrNotFound) {
					t.Errorf("error %v is ErrNotFound; an unreadable VG is not a missing one", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, vg := range r.VolumeGroups {
				names = append(names, vg.Name)
			}
			slices.Sort(names)
			if !slices.Equal(names, tt.wantVGs) {
				t.Errorf("report holds %v, want %v", names, tt.wantVGs)
			}
		})
	}
}

func TestReportInvalidVGRunsNothing(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	if _, err := f.client().Report(context.Background(), "rec-thick", "--all"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Report(--all) = %v, want ErrInvalidArgument", err)
	}
	if got := f.commands(); len(got) != 0 {
		t.Errorf("ran %v", got)
	}
}

// A failed mutation is explained from a report of its own VG only: another
// VG that LVM cannot read does not stop the classification.
func TestFailureReadsOnlyItsVolumeGroup(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	f.mutate = failWith(output{ExitCode: 5})
	err := f.client().RemoveLV(context.Background(), "rec-thick", "nosuchlv")
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrVolumeGroupNotFound) {
		t.Fatalf("error %v, want ErrNotFound of the LV", err)
	}
	for _, c := range f.calls {
		if c[0] == "fullreport" && c[len(c)-1] != "rec-thick" {
			t.Errorf("the classification read %v, want a report of rec-thick alone", c)
		}
	}
}
