package topology

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

func seg(kv ...string) *csi.Topology {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &csi.Topology{Segments: m}
}

func TestSegment(t *testing.T) {
	n := ForNode("node-a")
	s := n.Segment().GetSegments()
	if len(s) != 1 || s[Key] != "node-a" || n.Name() != "node-a" {
		t.Fatalf("Segment = %v", s)
	}
	if Key != "topology.carve.dev/node" {
		t.Fatalf("Key = %q; the key is fixed by DESIGN.md", Key)
	}
}

func TestAccepts(t *testing.T) {
	n := ForNode("node-a")
	tests := []struct {
		name string
		req  *csi.TopologyRequirement
		want bool
	}{
		{"no requirements", nil, true},
		{"empty requirements", &csi.TopologyRequirement{}, true},
		{"preferred only, other node", &csi.TopologyRequirement{Preferred: []*csi.Topology{seg(Key, "node-b")}}, true},
		{"requisite this node", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(Key, "node-a")}}, true},
		{"requisite among others", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(Key, "node-b"), seg(Key, "node-a")}}, true},
		{"requisite other node", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(Key, "node-b")}}, false},
		{"requisite foreign key", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg("topology.kubernetes.io/zone", "node-a")}}, false},
		{"requisite extra key", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(Key, "node-a", "zone", "z1")}}, false},
		{"requisite empty segment", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg()}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := n.Accepts(tt.req); got != tt.want {
				t.Errorf("Accepts = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestHasCapacityIn(t *testing.T) {
	n := ForNode("node-a")
	tests := []struct {
		name string
		seg  *csi.Topology
		want bool
	}{
		{"nil", nil, true},
		{"empty", seg(), true},
		{"this node", seg(Key, "node-a"), true},
		{"other node", seg(Key, "node-b"), false},
		{"foreign key", seg("zone", "z1"), false},
		{"extra key", seg(Key, "node-a", "zone", "z1"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := n.HasCapacityIn(tt.seg); got != tt.want {
				t.Errorf("HasCapacityIn = %v, want %v", got, tt.want)
			}
		})
	}
}
