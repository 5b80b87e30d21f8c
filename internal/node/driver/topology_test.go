package driver

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/topology"
)

func seg(kv ...string) *csi.Topology {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &csi.Topology{Segments: m}
}

func TestTopologySegment(t *testing.T) {
	n := nodeTopology{name: "node-a"}
	if !n.is(n.segment()) || n.is(nodeTopology{name: "node-b"}.segment()) || n.is(nil) {
		t.Fatalf("segment %v", n.segment())
	}
}

func TestTopologyAccepts(t *testing.T) {
	n := nodeTopology{name: "node-a"}
	tests := []struct {
		name string
		req  *csi.TopologyRequirement
		want bool
	}{
		{"no requirements", nil, true},
		{"empty requirements", &csi.TopologyRequirement{}, true},
		{"preferred only, other node", &csi.TopologyRequirement{Preferred: []*csi.Topology{seg(topology.Key, "node-b")}}, true},
		{"requisite this node", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(topology.Key, "node-a")}}, true},
		{"requisite among others", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(topology.Key, "node-b"), seg(topology.Key, "node-a")}}, true},
		{"requisite other node", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(topology.Key, "node-b")}}, false},
		{"requisite foreign key", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg("topology.kubernetes.io/zone", "node-a")}}, false},
		{"requisite extra key", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg(topology.Key, "node-a", "zone", "z1")}}, false},
		{"requisite empty segment", &csi.TopologyRequirement{Requisite: []*csi.Topology{seg()}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := n.accepts(tt.req); got != tt.want {
				t.Errorf("accepts = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTopologyHasCapacityIn(t *testing.T) {
	n := nodeTopology{name: "node-a"}
	tests := []struct {
		name string
		seg  *csi.Topology
		want bool
	}{
		{"nil", nil, true},
		{"empty", seg(), true},
		{"this node", seg(topology.Key, "node-a"), true},
		{"other node", seg(topology.Key, "node-b"), false},
		{"foreign key", seg("zone", "z1"), false},
		{"extra key", seg(topology.Key, "node-a", "zone", "z1"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := n.hasCapacityIn(tt.seg); got != tt.want {
				t.Errorf("hasCapacityIn = %v, want %v", got, tt.want)
			}
		})
	}
}
