package driver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/topology"
)

// nodeTopology answers the questions the CSI calls ask about segments:
// is this node's segment acceptable for a volume
// (accessibility_requirements), and is a GetCapacity segment this node's.
type nodeTopology struct {
	name string
}

func (n nodeTopology) segment() *csi.Topology {
	return &csi.Topology{Segments: topology.Segments(n.name)}
}

// is tells whether a segment names this node alone.
func (n nodeTopology) is(t *csi.Topology) bool {
	return t != nil && topology.NodeOf(t.GetSegments()) == n.name
}

// accepts tells whether a volume with these accessibility requirements
// may be created on this node. Without requirements, or without a
// requisite list, any node may hold the volume (preferred is only a
// hint, and the volume can only be made here). With a requisite list,
// this node's segment must be in it.
func (n nodeTopology) accepts(req *csi.TopologyRequirement) bool {
	requisite := req.GetRequisite()
	if len(requisite) == 0 {
		return true
	}
	for _, t := range requisite {
		if n.is(t) {
			return true
		}
	}
	return false
}

// hasCapacityIn tells whether GetCapacity for this segment should report
// this node's space: a missing or empty segment means "this node"; any
// other segment, another node's or one with foreign keys, has none of it.
func (n nodeTopology) hasCapacityIn(t *csi.Topology) bool {
	if len(t.GetSegments()) == 0 {
		return true
	}
	return n.is(t)
}
