package router

import (
	"context"
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/volume"
)

// The controller trusts a node only about that node: its TLS identity proves
// who answers, not what the answer says. Every ID and topology a node
// returns, which csi-provisioner writes into a PV and the router later
// routes by, is checked against the node asked; an answer naming another
// node, or a volume another PV holds, is refused (INTERNAL), logged and
// counted in carve_node_answers_refused_total.

// The reasons of carve_node_answers_refused_total.
const (
	refusedTopology      = "topology"
	refusedVolumeID      = "volume_id"
	refusedVolumeOfPV    = "volume_of_another_pv"
	refusedVolumeContext = "volume_context"
	refusedSnapshotID    = "snapshot_id"
	refusedPaging        = "paging"
	// refusedBlocks is a SnapshotBlocks answer breaking the stream's rules.
	refusedBlocks = "blocks"
)

// Refusals counts the answers of nodes the router refused.
type Refusals struct{ total *prometheus.CounterVec }

// NewRefusals registers carve_node_answers_refused_total with reg (if any).
func NewRefusals(reg prometheus.Registerer) (*Refusals, error) {
	r := &Refusals{total: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_node_answers_refused_total",
		Help: "Answers of node agents that carve controller refused because they named another node's volume, snapshot or topology, by node and reason; any is a node that lies or a bug.",
	}, []string{"node", "reason"})}
	if reg != nil {
		if err := reg.Register(r.total); err != nil {
			return nil, fmt.Errorf("router: registering its metrics: %w", err)
		}
	}
	return r, nil
}

// Count counts one refused answer of node.
func (r *Refusals) Count(node, reason string) { r.add(node, reason, 1) }

func (r *Refusals) add(node, reason string, n int) {
	if r != nil && n > 0 {
		r.total.WithLabelValues(node, reason).Add(float64(n))
	}
}

func (s *Server) refuse(ctx context.Context, node, method, reason, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	klog.FromContext(ctx).Error(nil, "Refused a node agent's answer: it names what is not that node's", "node", node, "call", method, "reason", reason, "answer", msg)
	s.cfg.Refusals.Count(node, reason)
	return status.Errorf(codes.Internal, "node %s answered %s with %s; carve trusts a node only about its own volumes, so the answer is refused", node, method, msg)
}

// checkCreated refuses a CreateVolume answer that is not exactly node's:
// topology node's one segment, an ID no PV of another name holds, and a
// volume context naming the volume asked for.
func (s *Server) checkCreated(ctx context.Context, node, name string, resp *csi.CreateVolumeResponse) error {
	v := resp.GetVolume()
	if t := v.GetAccessibleTopology(); len(t) != 1 || !s.isNode(t[0], node) {
		return s.refuse(ctx, node, "CreateVolume", refusedTopology, "accessible_topology %v", t)
	}
	id := v.GetVolumeId()
	if vid, err := volume.ParseID(id); err != nil || vid.LV != volume.LVNameFor(name) {
		return s.refuse(ctx, node, "CreateVolume", refusedVolumeID, "volume_id %q, which is not the ID of volume %s", id, name)
	}
	if got := v.GetVolumeContext()[volume.ContextVolumeName]; got != name {
		return s.refuse(ctx, node, "CreateVolume", refusedVolumeContext, "volume_context %s=%q for volume %s", volume.ContextVolumeName, got, name)
	}
	pvs, err := s.cfg.Volumes.PVsOf(id)
	if err != nil {
		return status.Errorf(codes.Unavailable, "node %s made volume %s: which PersistentVolumes hold it is not known yet: %v; retry later", node, id, err)
	}
	if others := slices.DeleteFunc(pvs, func(pv string) bool { return pv == name }); len(others) > 0 {
		return s.refuse(ctx, node, "CreateVolume", refusedVolumeOfPV, "volume_id %q, which PersistentVolume %s holds", id, others[0])
	}
	return nil
}

func (s *Server) isNode(t *csi.Topology, node string) bool {
	seg := t.GetSegments()
	return len(seg) == 1 && seg[s.cfg.TopologyKey] == node
}

// checkSnapshot refuses a snapshot not on node (its ID routes later calls)
// or, with want set, not the one asked for.
func (s *Server) checkSnapshot(ctx context.Context, node, method string, snap *csi.Snapshot, want string) error {
	id := snap.GetSnapshotId()
	owner, _, _, err := volume.ParseSnapshotID(id)
	if err != nil || owner != node || (want != "" && id != want) {
		return s.refuse(ctx, node, method, refusedSnapshotID, "snapshot_id %q", id)
	}
	return nil
}

// ownSnapshots keeps a ListSnapshots page's entries that are node's, refusing
// the others.
func (s *Server) ownSnapshots(ctx context.Context, node string, entries []*csi.ListSnapshotsResponse_Entry) []*csi.ListSnapshotsResponse_Entry {
	var refused pageRefusals
	kept := slices.DeleteFunc(entries, func(e *csi.ListSnapshotsResponse_Entry) bool {
		id := e.GetSnapshot().GetSnapshotId()
		if owner, _, _, err := volume.ParseSnapshotID(id); err != nil || owner != node {
			refused.add(fmt.Sprintf("snapshot_id %q", id))
			return true
		}
		return false
	})
	refused.report(ctx, s, node, "ListSnapshots", refusedSnapshotID)
	return kept
}

// ownVolumes keeps a ListVolumes page's entries whose topology is node's.
func (s *Server) ownVolumes(ctx context.Context, node string, entries []*csi.ListVolumesResponse_Entry) []*csi.ListVolumesResponse_Entry {
	var refused pageRefusals
	kept := slices.DeleteFunc(entries, func(e *csi.ListVolumesResponse_Entry) bool {
		t := e.GetVolume().GetAccessibleTopology()
		if len(t) == 1 && s.isNode(t[0], node) {
			return false
		}
		refused.add(fmt.Sprintf("volume %q with accessible_topology %v", e.GetVolume().GetVolumeId(), t))
		return true
	})
	refused.report(ctx, s, node, "ListVolumes", refusedTopology)
	return kept
}

// pageRefusals are logged once per page, so a node listing a million
// entries of others' cannot flood the log.
type pageRefusals struct {
	n     int
	first string
}

func (p *pageRefusals) add(what string) {
	if p.n == 0 {
		p.first = what
	}
	p.n++
}

func (p *pageRefusals) report(ctx context.Context, s *Server, node, method, reason string) {
	if p.n == 0 {
		return
	}
	klog.FromContext(ctx).Error(nil, "Refused entries of a node agent's list page: they name what is not that node's",
		"node", node, "call", method, "reason", reason, "refused", p.n, "first", p.first)
	s.cfg.Refusals.add(node, reason, p.n)
}
