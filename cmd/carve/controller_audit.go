//go:build !nodeagent

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/audit"
	"github.com/carve-csi/carve/internal/controller/kube"
	"github.com/carve-csi/carve/internal/controller/paging"
	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/topology"
)

// nodeCallTimeout bounds one Inventory, QuarantineOrphan or RemoveOrphan
// call of the audit.
const nodeCallTimeout = 30 * time.Second

// nodeAgents reaches the node agents' NodeAgent and CSI Controller services;
// *agents.Pool is one.
type nodeAgents interface {
	Names() []string
	NodeAgent(ctx context.Context, node string) (nodeagentv1.NodeAgentClient, error)
	Controller(ctx context.Context, node string) (csi.ControllerClient, error)
}

// auditNodes is the audit's view of the node agents, over the node channel.
type auditNodes struct{ pool nodeAgents }

var _ audit.Nodes = auditNodes{}

func (n auditNodes) Names() []string { return n.pool.Names() }

func (n auditNodes) Inventory(ctx context.Context, node string) (*audit.Inventory, error) {
	c, err := n.pool.NodeAgent(ctx, node)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	resp, err := c.Inventory(ctx, &nodeagentv1.InventoryRequest{})
	if err != nil {
		return nil, err
	}
	return inventoryOf(resp), nil
}

func (n auditNodes) QuarantineOrphan(ctx context.Context, node, vg, name string, at time.Time) (string, error) {
	c, err := n.pool.NodeAgent(ctx, node)
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

func (n auditNodes) RemoveOrphan(ctx context.Context, node, vg, name, orphanOf string) error {
	c, err := n.pool.NodeAgent(ctx, node)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	_, err = c.RemoveOrphan(ctx, &nodeagentv1.RemoveOrphanRequest{VolumeGroup: vg, Name: name, OrphanOf: orphanOf})
	return err
}

// VolumeHealth pages through the node's ControllerListVolumeHealth: its
// volumes with a health problem, from its view.
func (n auditNodes) VolumeHealth(ctx context.Context, node string) ([]audit.VolumeHealth, error) {
	c, err := n.pool.Controller(ctx, node)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	var out []audit.VolumeHealth
	err = walkPages(func(token string) (proto.Message, string, int, error) {
		resp, err := c.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{StartingToken: token})
		for _, e := range resp.GetEntries() {
			h := audit.VolumeHealth{ID: e.GetVolumeId()}
			for _, s := range e.GetHealthStatuses() {
				h.Problems = append(h.Problems, audit.Problem{Status: s.GetStatus().String(), Reason: s.GetReason(), Message: s.GetMessage()})
			}
			out = append(out, h)
		}
		return resp, resp.GetNextToken(), len(resp.GetEntries()), err
	})
	return out, err
}

// walkPages follows a node's list from its first page within paging's
// limits: page asks for the page at token and returns it, its next token
// and its number of entries. A node past the limits, or one that hands
// out a token twice, fails its own list (paging.ErrRefused).
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

// inventoryOf is a node agent's inventory as the audit reads it.
func inventoryOf(resp *nodeagentv1.InventoryResponse) *audit.Inventory {
	inv := &audit.Inventory{Unreadable: resp.GetUnreadableVolumeGroups(), Busy: resp.GetBusy()}
	for _, d := range resp.GetDeviceClasses() {
		inv.Classes = append(inv.Classes, audit.Class{Name: d.GetName(), VolumeGroup: d.GetVolumeGroup()})
	}
	for _, lv := range resp.GetVolumes() {
		l := audit.LV{VolumeGroup: lv.GetVolumeGroup(), Name: lv.GetName(), Size: uint64(max(lv.GetSizeBytes(), 0)),
			Class: lv.GetDeviceClass(), VolumeName: lv.GetVolumeName(), Claim: lv.GetClaim(), OrphanOf: lv.GetOrphanOf()}
		if s := lv.GetOrphanedAtUnix(); s > 0 {
			l.OrphanedAt = time.Unix(s, 0)
		}
		inv.LVs = append(inv.LVs, l)
	}
	return inv
}

// startAudit builds the audit of the nodes' LVs against the PV index (and,
// with dyn, of their snapshots' validity); what
// it returns runs it (under leader election when asked) until ctx ends.
// The index is run by its owner, the route.
func startAudit(ctx context.Context, o *ControllerOptions, client kubernetes.Interface, dyn dynamic.Interface, pvs *pvindex.Index, pool nodeAgents,
	reg prometheus.Registerer) func(context.Context) error {
	rec, stop := kube.Recorder(ctx, client, "carve-controller", "")
	cfg := audit.Config{Driver: o.DriverName, TopologyKey: topology.Key, Client: client, PVs: pvs,
		Nodes: auditNodes{pool}, Grace: o.Audit.Grace, RemovalGrace: o.Audit.RemovalGrace, Interval: o.Audit.Interval, RemoveOrphans: o.Audit.RemoveOrphans,
		Registerer: reg, Events: rec}
	if dyn != nil {
		cfg.Contents = snapshotContents{dyn: dyn, driver: o.DriverName}
	}
	a := audit.New(cfg)
	return func(ctx context.Context) error {
		defer stop()
		if err := o.whileLeading(ctx, client, auditLease, a.Run); err != nil {
			return fmt.Errorf("the audit: %w", err)
		}
		return nil
	}
}
