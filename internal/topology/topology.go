// Package topology holds carve's topology key and answers the questions the
// controller asks about segments: is this node's segment acceptable for a
// volume (accessibility_requirements), and is a GetCapacity segment this
// node's. Every carve volume lives on one node, so a segment is exactly
// {topology.carve.dev/node: <node name>}.
package topology

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
)

// Key is the topology key; its value is the Kubernetes node name.
const Key = "topology.carve.dev/node"

// Node is this node's place in the topology.
type Node struct {
	name string
}

// ForNode returns the topology of the node named name.
func ForNode(name string) Node { return Node{name: name} }

// Name is the node name.
func (n Node) Name() string { return n.name }

// Segment is this node's segment, in the form CSI responses carry.
func (n Node) Segment() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{Key: n.name}}
}

// Is tells whether a segment names this node. A segment matches when its
// carve key holds this node's name; a segment with other keys as well is
// not carve's and does not match.
func (n Node) Is(t *csi.Topology) bool {
	if t == nil {
		return false
	}
	s := t.GetSegments()
	return len(s) == 1 && s[Key] == n.name
}

// Accepts tells whether a volume with these accessibility requirements may
// be created on this node. Without requirements, or without a requisite
// list, any node may hold the volume (preferred is only a hint, and the
// volume can only be made here). With a requisite list, this node's segment
// must be in it.
func (n Node) Accepts(req *csi.TopologyRequirement) bool {
	requisite := req.GetRequisite()
	if len(requisite) == 0 {
		return true
	}
	for _, t := range requisite {
		if n.Is(t) {
			return true
		}
	}
	return false
}

// HasCapacityIn tells whether GetCapacity for this segment should report
// this node's space: a missing or empty segment means "this node"; any
// other segment, another node's or one with foreign keys, has none of it.
func (n Node) HasCapacityIn(t *csi.Topology) bool {
	if len(t.GetSegments()) == 0 {
		return true
	}
	return n.Is(t)
}
