package volume

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/lvmname"
)

// uuidPV is the CSI name external-provisioner gives a volume: the PV name.
const uuidPV = "pvc-7d3c1a0e-0b6f-4f5e-9d1a-3c2b1a0f9e8d"

func TestEscapeTagValue(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{uuidPV, uuidPV},
		{"data-pg-0.example", "data-pg-0.example"},
		{"Mixed_Case+1", "Mixed_Case+1"},
		{"with space", "with:20space"},
		{"a/b", "a:2Fb"},
		{"a:b", "a:3Ab"},
		{"::", ":3A:3A"},
		{"=!&#", ":3D:21:26:23"},
		{"ü", ":C3:BC"},
		{"\x00\xff", ":00:FF"},
		{"-leading", "-leading"},
	}
	for _, tt := range tests {
		if got := escapeTagValue(tt.in); got != tt.want {
			t.Errorf("escapeTagValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got, ok := unescapeTagValue(tt.want); !ok || got != tt.in {
			t.Errorf("unescapeTagValue(%q) = %q, %v; want %q", tt.want, got, ok, tt.in)
		}
	}
}

// Only escapeTagValue's own spelling is read: one value, one tag.
func TestUnescapeTagValueRejects(t *testing.T) {
	for _, v := range []string{":", ":2", ":2f", ":zz", ":41", "a::", "a b", "a/b", "a=b", ":3A:", "\xff"} {
		if got, ok := unescapeTagValue(v); ok {
			t.Errorf("unescapeTagValue(%q) = %q, accepted", v, got)
		}
	}
}

// oddNames are CSI names another CO could send: every byte value, names
// made of escapes, names at and past what fits one tag.
func oddNames() []string {
	var all []byte
	for b := 0; b < 256; b++ {
		all = append(all, byte(b))
	}
	return []string{
		"pvc-1", uuidPV, "with space", "ünïcode ✓", "sanity name with spaces/and:colons",
		string(all), strings.Repeat("n", 128), strings.Repeat("n", MaxNameLength),
		strings.Repeat("/", MaxNameLength), strings.Repeat("ab/", MaxNameLength/3),
		strings.Repeat("x", lvmname.MaxTagLength-len(TagNamePrefix)),
		strings.Repeat("x", lvmname.MaxTagLength-len(TagNamePrefix)+1),
		strings.Repeat("x", lvmname.MaxTagLength-len(TagNamePrefix)-2) + "/",
		strings.Repeat("x", lvmname.MaxTagLength-len(TagNamePrefix)-1) + "/",
	}
}

func TestVolumeTag(t *testing.T) {
	for _, name := range oddNames() {
		tag := VolumeTag(name)
		if err := lvmname.Tag(tag); err != nil {
			t.Errorf("VolumeTag(%.40q...) is not an LVM tag: %v", name, err)
		}
		tags := []string{TagOwner, tag, TagClassPrefix + "fast"}
		if !HasVolumeName(tags, name) {
			t.Errorf("HasVolumeName(VolumeTag(%.40q...)) is false", name)
		}
		if HasVolumeName(tags, name+"x") || (name != "" && HasVolumeName(tags, name[:len(name)-1])) {
			t.Errorf("VolumeTag(%.40q...) matches another name", name)
		}
		got, whole, ok := VolumeNameFromTags(tags)
		fits := len(TagNamePrefix)+len(escapeTagValue(name)) <= lvmname.MaxTagLength
		switch {
		case !ok:
			t.Errorf("VolumeNameFromTags(VolumeTag(%.40q...)) found nothing", name)
		case whole != fits:
			t.Errorf("VolumeNameFromTags(VolumeTag(%.40q...)) whole = %v, want %v", name, whole, fits)
		case whole && got != name:
			t.Errorf("VolumeNameFromTags(VolumeTag(%.40q...)) = %.40q", name, got)
		case !whole && (!strings.HasPrefix(name, got) || len(got) == 0):
			t.Errorf("VolumeNameFromTags(VolumeTag(%.40q...)) = %.40q, not a head of the name", name, got)
		}
	}
}

// Names that fit show as they are in lvs; those that do not share a
// readable head and still tell each other apart.
func TestVolumeTagForm(t *testing.T) {
	if got, want := VolumeTag(uuidPV), "carve.dev/name="+uuidPV; got != want {
		t.Errorf("VolumeTag(%q) = %q, want %q", uuidPV, got, want)
	}
	a := strings.Repeat("é", MaxNameLength/2)
	b := a[:len(a)-1] + "\xa8"
	ta, tb := VolumeTag(a), VolumeTag(b)
	cut := regexp.MustCompile(`^carve\.dev/name=(:C3|:A9)+::[0-9a-f]{32}$`)
	if !cut.MatchString(ta) || !cut.MatchString(tb) || len(ta) > lvmname.MaxTagLength {
		t.Errorf("VolumeTag of a long name = %q (%d bytes), want its head, '::' and a hash within %d bytes", ta, len(ta), lvmname.MaxTagLength)
	}
	if ta == tb {
		t.Errorf("two long names with one head share the tag %q", ta)
	}
}

func TestClaimTag(t *testing.T) {
	long := strings.Repeat("c", lvmname.MaxTagLength)
	tests := []struct {
		ns, name string
		want     string // "" when the claim is too long to be read back
	}{
		{"default", "data-pg-0", "carve.dev/pvc=default/data-pg-0"},
		{"kube-system", "x", "carve.dev/pvc=kube-system/x"},
		{strings.Repeat("n", 63), strings.Repeat("p", 253), "carve.dev/pvc=" + strings.Repeat("n", 63) + "/" + strings.Repeat("p", 253)},
		{"a/b", "c", "carve.dev/pvc=a:2Fb/c"},
		{"a", "b/c", "carve.dev/pvc=a/b:2Fc"},
		{"ns one", "claim:1", "carve.dev/pvc=ns:20one/claim:3A1"},
		{"default", long, ""},
	}
	for _, tt := range tests {
		tag := ClaimTag(tt.ns, tt.name)
		if err := lvmname.Tag(tag); err != nil {
			t.Errorf("ClaimTag(%q, %.40q...) is not an LVM tag: %v", tt.ns, tt.name, err)
		}
		got, ok := ClaimFromTags([]string{TagOwner, tag})
		if tt.want == "" {
			if ok || !strings.HasPrefix(tag, TagClaimPrefix+"default/ccc") || !strings.Contains(tag, tagTruncated) {
				t.Errorf("ClaimTag(%q, <%d bytes>) = %q, read back as %v %v", tt.ns, len(tt.name), tag, got, ok)
			}
			continue
		}
		if tag != tt.want {
			t.Errorf("ClaimTag(%q, %q) = %q, want %q", tt.ns, tt.name, tag, tt.want)
		}
		if !ok || got != (Claim{tt.ns, tt.name}) {
			t.Errorf("ClaimFromTags(%q) = %v, %v", tag, got, ok)
		}
	}
	for _, tags := range [][]string{nil, {TagOwner}, {TagClaimPrefix + "nons"}, {TagClaimPrefix + "a/b c"}} {
		if got, ok := ClaimFromTags(tags); ok {
			t.Errorf("ClaimFromTags(%q) = %v, want nothing", tags, got)
		}
	}
}

func TestVolumeTags(t *testing.T) {
	claim := map[string]string{ParamPVCNamespace: "db", ParamPVCName: "data-pg-0", ParamPVName: uuidPV}
	tests := []struct {
		name   string
		params map[string]string
		want   []string
	}{
		{"no metadata", nil, []string{TagOwner, "carve.dev/name=" + uuidPV, "carve.dev/class=fast"}},
		{"extra-create-metadata", claim, []string{TagOwner, "carve.dev/name=" + uuidPV, "carve.dev/class=fast", "carve.dev/pvc=db/data-pg-0"}},
		{"namespace only", map[string]string{ParamPVCNamespace: "db"}, []string{TagOwner, "carve.dev/name=" + uuidPV, "carve.dev/class=fast"}},
		{"pv name differs", map[string]string{ParamPVName: "other pv"},
			[]string{TagOwner, "carve.dev/name=" + uuidPV, "carve.dev/class=fast", "carve.dev/pv=other:20pv"}},
	}
	for _, tt := range tests {
		got := VolumeTags(uuidPV, "fast", tt.params)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: VolumeTags = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestAskedTag(t *testing.T) {
	tag := AskedTag(256<<20, 300<<20)
	if err := lvmname.Tag(tag); err != nil {
		t.Fatalf("AskedTag %q: %v", tag, err)
	}
	for _, tc := range []struct {
		tags        []string
		asked, made uint64
		ok          bool
	}{
		{[]string{TagOwner, tag}, 256 << 20, 300 << 20, true},
		{[]string{TagOwner}, 0, 0, false},
		{[]string{TagAskedPrefix + "300/300"}, 300, 300, false}, // not bigger than asked
		{[]string{TagAskedPrefix + "12"}, 12, 0, false},
		{[]string{TagAskedPrefix + "x/3"}, 0, 3, false},
	} {
		asked, made, ok := AskedFromTags(tc.tags)
		if ok != tc.ok || ok && (asked != tc.asked || made != tc.made) {
			t.Errorf("AskedFromTags(%q) = %d, %d, %v; want %d, %d, %v", tc.tags, asked, made, ok, tc.asked, tc.made, tc.ok)
		}
	}
}

// TestOwnerFromTags reads back what VolumeTags writes; a name too long to
// be held whole is not given as the volume's name.
func TestOwnerFromTags(t *testing.T) {
	claim := map[string]string{ParamPVCNamespace: "db", ParamPVCName: "data-pg-0", ParamPVName: uuidPV}
	long := strings.Repeat("n", 4000)
	tests := []struct {
		name string
		tags []string
		want Owner
	}{
		{"with its claim", VolumeTags(uuidPV, "fast", claim), Owner{Class: "fast", VolumeName: uuidPV, Claim: "db/data-pg-0"}},
		{"no claim", VolumeTags(uuidPV, "fast", nil), Owner{Class: "fast", VolumeName: uuidPV}},
		{"a name held in part", VolumeTags(long, "fast", nil), Owner{Class: "fast"}},
		{"no tags", nil, Owner{}},
	}
	for _, tt := range tests {
		if got := OwnerFromTags(tt.tags); got != tt.want {
			t.Errorf("%s: OwnerFromTags = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
