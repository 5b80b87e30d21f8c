package volume

import (
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/lvmname"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// FuzzVolumeName checks the mapping of a CSI volume name to what carve
// writes into LVM: the LV name and every tag are names LVM accepts, the ID
// parses back to the VG and LV, the name tag reads back as the name (or
// its head, when too long for a tag) and matches no other name.
func FuzzVolumeName(f *testing.F) {
	f.Add("pvc-7d3c1a0e-0b6f-4f5e-9d1a-3c2b1a0f9e8d", "pvc-1", "default", "data-pg-0")
	f.Add("", "x", "", "")
	f.Add("a/b c:41", "a/b c:4", "ns", "claim/with/slashes")
	f.Add(strings.Repeat("x", 500), strings.Repeat("x", 499)+"y", strings.Repeat("n", 253), strings.Repeat("c", 253))
	f.Add(strings.Repeat("\xff", 400), strings.Repeat("\xff", 401), "::", ":")
	f.Add("carve.dev/name=x", "\x00", "a", "b")

	f.Fuzz(func(t *testing.T, name, other, ns, claim string) {
		lv := LVNameFor(name)
		if err := lvmname.LV(lv); err != nil || len(lv) != len(lvNamePrefix)+32 || LVNameFor(name) != lv {
			t.Fatalf("LVNameFor(%q) = %q: %v", name, lv, err)
		}
		if other != name && LVNameFor(other) == lv {
			t.Errorf("%q and %q share LV name %s", name, other, lv)
		}
		id := VolumeID("vg0", lv)
		vg, gotLV, err := ParseVolumeID(id)
		if err != nil || vg != "vg0" || gotLV != lv {
			t.Errorf("ParseVolumeID(%q) = %q, %q, %v", id, vg, gotLV, err)
		}

		tags := VolumeTags(name, "fast", map[string]string{ParamPVCNamespace: ns, ParamPVCName: claim, ParamPVName: other})
		for _, tag := range tags {
			if err := lvmname.Tag(tag); err != nil {
				t.Errorf("tag %q: %v", tag, err)
			}
		}
		req := lvm.CreateRequest{VolumeGroup: vg, Name: lv, Tags: tags, Size: 1 << 30}
		if err := req.Validate(); err != nil {
			t.Errorf("the create request of volume %q: %v", name, err)
		}

		got, whole, ok := VolumeNameFromTags(tags)
		switch {
		case !ok:
			t.Fatalf("VolumeNameFromTags(%q) found no name", tags)
		case whole && got != name:
			t.Errorf("name %q reads back as %q", name, got)
		case !whole && !strings.HasPrefix(name, got):
			t.Errorf("name %q, cut, reads back as %q, not its head", name, got)
		}
		if !HasVolumeName(tags, name) {
			t.Errorf("HasVolumeName(%q, %q) = false", tags, name)
		}
		if other != name && HasVolumeName(tags, other) {
			t.Errorf("the tags of %q say they are volume %q: %q", name, other, tags)
		}
		if c, ok := ClassFromTags(tags); !ok || c != "fast" {
			t.Errorf("ClassFromTags = %q, %v", c, ok)
		}
		// A claim that fits a tag reads back; one that does not is not
		// read as another claim.
		if c, ok := ClaimFromTags(tags); ok && (c.Namespace != ns || c.Name != claim) {
			t.Errorf("claim %s/%s reads back as %s", ns, claim, c)
		} else if !ok && ns != "" && claim != "" && len(TagClaimPrefix)+len(escapeTagValue(ns))+1+len(escapeTagValue(claim)) <= lvmname.MaxTagLength {
			t.Errorf("claim %s/%s fits a tag but does not read back", ns, claim)
		}

		if v, ok := unescapeTagValue(escapeTagValue(name)); !ok || v != name {
			t.Errorf("unescape(escape(%q)) = %q, %v", name, v, ok)
		}
		if IsSnapshot(tags) {
			t.Errorf("the tags of volume %q mark a snapshot: %q", name, tags)
		}

		// The same name as a snapshot's: an LV name no volume ID accepts,
		// tags LVM accepts, an ID that parses back, the name read back.
		snap := SnapshotLVNameFor(name)
		if err := lvmname.LV(snap); err != nil {
			t.Errorf("SnapshotLVNameFor(%q) = %q: %v", name, snap, err)
		}
		if _, _, err := ParseVolumeID(VolumeID("vg0", snap)); err == nil {
			t.Errorf("snapshot LV %s parses as a volume ID", snap)
		}
		sid := SnapshotID("node-a", "vg0", snap)
		if n, g, l, err := ParseSnapshotID(sid); err != nil || n != "node-a" || g != "vg0" || l != snap {
			t.Errorf("ParseSnapshotID(%q) = %q, %q, %q, %v", sid, n, g, l, err)
		}
		stags := append(SnapshotTags(name, "fast", lv), FromSnapshotTag(sid), FromVolumeTag(id))
		if err := (lvm.CreateRequest{VolumeGroup: vg, Name: snap, Tags: stags, Size: 1 << 30}).Validate(); err != nil {
			t.Errorf("the tags of snapshot %q: %v", name, err)
		}
		if !IsSnapshot(stags) || !HasSnapshotName(stags, name) || (other != name && HasSnapshotName(stags, other)) {
			t.Errorf("snapshot tags %q do not say snapshot %q alone", stags, name)
		}
		if o, ok := OriginFromTags(stags); !ok || o != lv {
			t.Errorf("OriginFromTags = %q, %v; want %q", o, ok, lv)
		}
	})
}

// FuzzParseVolumeID checks that an ID ParseVolumeID accepts is the ID of
// its parts and names a VG and an LV that LVM accepts, so a device path
// built from them stays a path under the device directory.
func FuzzParseVolumeID(f *testing.F) {
	f.Add(VolumeID("vg0", LVNameFor("pvc-1")))
	f.Add("vg0/carve-")
	f.Add("../carve-00")
	f.Add("vg0/carve-x/y")
	f.Add("vg0/carve-x_tmeta")
	f.Add("vg0/" + SnapshotLVNameFor("snap-1"))
	f.Fuzz(func(t *testing.T, id string) {
		vg, lv, err := ParseVolumeID(id)
		if err != nil {
			return
		}
		if VolumeID(vg, lv) != id {
			t.Errorf("ParseVolumeID(%q) = %q, %q: not its parts", id, vg, lv)
		}
		if err := lvmname.VG(vg); err != nil {
			t.Errorf("ParseVolumeID(%q) accepted VG %q: %v", id, vg, err)
		}
		if err := lvmname.LV(lv); err != nil || !strings.HasPrefix(lv, lvNamePrefix) {
			t.Errorf("ParseVolumeID(%q) accepted LV %q: %v", id, lv, err)
		}
	})
}
