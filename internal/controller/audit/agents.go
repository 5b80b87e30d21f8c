package audit

import (
	"context"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/paging"
	"github.com/carve-csi/carve/internal/volume"
)

const nodeCallTimeout = 30 * time.Second

// Agents reaches the node agents' services; *agents.Pool is one.
type Agents interface {
	Names() []string
	NodeAgent(ctx context.Context, node string) (nodeagentv1.NodeAgentClient, error)
	Controller(ctx context.Context, node string) (csi.ControllerClient, error)
}

// AgentNodes are the node agents as the audit uses them.
type AgentNodes struct{ Pool Agents }

var _ Nodes = AgentNodes{}

// Names lists the connected nodes.
func (n AgentNodes) Names() []string { return n.Pool.Names() }

// Inventory asks the node for its carve LVs.
func (n AgentNodes) Inventory(ctx context.Context, node string) (*Inventory, error) {
	c, err := n.Pool.NodeAgent(ctx, node)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	resp, err := c.Inventory(ctx, &nodeagentv1.InventoryRequest{})
	if err != nil {
		return nil, err
	}
	return InventoryOf(resp), nil
}

// QuarantineOrphan asks the node to quarantine an orphan.
func (n AgentNodes) QuarantineOrphan(ctx context.Context, node, vg, name string, at time.Time) (string, error) {
	c, err := n.Pool.NodeAgent(ctx, node)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	resp, err := c.QuarantineOrphan(ctx, &nodeagentv1.QuarantineOrphanRequest{VolumeGroup: vg, Name: name, OrphanedAtUnix: at.Unix()})
	if err != nil {
		return "", err
	}
	return resp.GetName(), nil
}

// RemoveOrphan asks the node to remove a quarantined orphan.
func (n AgentNodes) RemoveOrphan(ctx context.Context, node, vg, name, orphanOf string) error {
	c, err := n.Pool.NodeAgent(ctx, node)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	_, err = c.RemoveOrphan(ctx, &nodeagentv1.RemoveOrphanRequest{VolumeGroup: vg, Name: name, OrphanOf: orphanOf})
	return err
}

// VolumeHealth pages through the node's ControllerListVolumeHealth.
func (n AgentNodes) VolumeHealth(ctx context.Context, node string) ([]VolumeHealth, error) {
	var out []VolumeHealth
	err := n.walkNode(ctx, node, func(ctx context.Context, c csi.ControllerClient, token string) (proto.Message, string, int, error) {
		resp, err := c.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{StartingToken: token})
		for _, e := range resp.GetEntries() {
			h := VolumeHealth{ID: e.GetVolumeId()}
			for _, s := range e.GetHealthStatuses() {
				h.Problems = append(h.Problems, Problem{Status: s.GetStatus().String(), Reason: s.GetReason(), Message: s.GetMessage()})
			}
			out = append(out, h)
		}
		return resp, resp.GetNextToken(), len(resp.GetEntries()), err
	})
	return out, err
}

// walkNode walks a list of node's Controller with walkPages, the whole
// walk within nodeCallTimeout; page asks c for the page at token.
func (n AgentNodes) walkNode(ctx context.Context, node string, page func(ctx context.Context, c csi.ControllerClient, token string) (proto.Message, string, int, error)) error {
	c, err := n.Pool.Controller(ctx, node)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	return walkPages(func(token string) (proto.Message, string, int, error) { return page(ctx, c, token) })
}

// walkPages follows a node's list within paging's limits; page returns a
// page, its next token and its entry count. A node past the limits or
// repeating a token fails its own list (paging.ErrRefused).
func walkPages(page func(token string) (proto.Message, string, int, error)) error {
	walk := paging.New(paging.Default(), "")
	for token := ""; ; {
		resp, next, entries, err := page(token)
		if err != nil {
			return err
		}
		if err := walk.Page(entries, proto.Size(resp), next); err != nil {
			return err
		}
		if token = next; token == "" {
			return nil
		}
	}
}

// InventoryOf is a node agent's inventory as the audit reads it.
func InventoryOf(resp *nodeagentv1.InventoryResponse) *Inventory {
	inv := &Inventory{Unreadable: resp.GetUnreadableVolumeGroups(), Busy: resp.GetBusy()}
	for _, d := range resp.GetDeviceClasses() {
		inv.Classes = append(inv.Classes, Class{Name: d.GetName(), VolumeGroup: d.GetVolumeGroup()})
	}
	for _, lv := range resp.GetVolumes() {
		l := LV{VolumeGroup: lv.GetVolumeGroup(), Name: lv.GetName(), Size: uint64(max(lv.GetSizeBytes(), 0)),
			Class: lv.GetDeviceClass(), VolumeName: lv.GetVolumeName(), Claim: lv.GetClaim(), OrphanOf: lv.GetOrphanOf()}
		if s := lv.GetOrphanedAtUnix(); s > 0 {
			l.OrphanedAt = time.Unix(s, 0)
		}
		inv.LVs = append(inv.LVs, l)
	}
	return inv
}

// InvalidSnapshots lists the IDs the node reports not ready (a thick
// snapshot out of copy-on-write space). A node is trusted only about its
// own snapshots: an ID naming another node is left out.
func (n AgentNodes) InvalidSnapshots(ctx context.Context, node string) ([]string, error) {
	var out []string
	err := n.walkNode(ctx, node, func(ctx context.Context, c csi.ControllerClient, token string) (proto.Message, string, int, error) {
		resp, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: token})
		refused, first := 0, ""
		for _, e := range resp.GetEntries() {
			s := e.GetSnapshot()
			if owner, _, _, perr := volume.ParseSnapshotID(s.GetSnapshotId()); perr != nil || owner != node {
				if refused == 0 {
					first = s.GetSnapshotId()
				}
				refused++
				continue
			}
			if !s.GetReadyToUse() {
				out = append(out, s.GetSnapshotId())
			}
		}
		if refused > 0 {
			// Once a page, so a node listing others' snapshots cannot flood the log.
			klog.FromContext(ctx).Error(nil, "Refused entries of a node agent's snapshot page: they are not the node's",
				"node", node, "refused", refused, "first", first)
		}
		return resp, resp.GetNextToken(), len(resp.GetEntries()), err
	})
	return out, err
}
