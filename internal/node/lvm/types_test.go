package lvm

import "testing"

// TestDevice: the path LVM reported wins; without one, the link under the
// device directory.
func TestDevice(t *testing.T) {
	reported := &LogicalVolume{VolumeGroup: "vg0", Name: "carve-a", Path: "/alt/dev/vg0/carve-a"}
	if got := reported.Device("/dev"); got != "/alt/dev/vg0/carve-a" {
		t.Errorf("the path LVM reported: %q", got)
	}
	if got := (&LogicalVolume{VolumeGroup: "vg0", Name: "carve-a"}).Device("/alt/dev"); got != "/alt/dev/vg0/carve-a" {
		t.Errorf("no path reported: %q", got)
	}
}
