package driver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/topology"
)

// nodeTopology answers the CSI calls' questions about segments.
type nodeTopology struct {
	name string
}

func (n nodeTopology) segment() *csi.Topology {
	return &csi.Topology{Segments: topology.Segments(n.name)}
}

func (n nodeTopology) is(t *csi.Topology) bool {
	return t != nil && topology.NodeOf(t.GetSegments()) == n.name
}

// accepts tells whether this node may hold a volume with req: any node
// without a requisite list, else this node's segment must be in it.
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

// hasCapacityIn tells whether a GetCapacity segment is this node's: a
// missing or empty one is.
func (n nodeTopology) hasCapacityIn(t *csi.Topology) bool {
	if len(t.GetSegments()) == 0 {
		return true
	}
	return n.is(t)
}
