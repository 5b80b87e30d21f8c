package topology

import "testing"

func TestSegments(t *testing.T) {
	s := Segments("node-a")
	if len(s) != 1 || s[Key] != "node-a" {
		t.Fatalf("Segments = %v", s)
	}
	if Key != "topology.carve.dev/node" {
		t.Fatalf("Key = %q; the key is fixed by DESIGN.md", Key)
	}
}

func TestNodeOf(t *testing.T) {
	for _, tt := range []struct {
		name string
		seg  map[string]string
		want string
	}{
		{"carve's", map[string]string{Key: "node-a"}, "node-a"},
		{"none", nil, ""},
		{"foreign key", map[string]string{"topology.kubernetes.io/zone": "node-a"}, ""},
		{"extra key", map[string]string{Key: "node-a", "zone": "z1"}, ""},
	} {
		if got := NodeOf(tt.seg); got != tt.want {
			t.Errorf("%s: NodeOf = %q, want %q", tt.name, got, tt.want)
		}
	}
}
