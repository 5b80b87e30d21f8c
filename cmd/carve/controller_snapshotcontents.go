//go:build !nodeagent

package main

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/controller/audit"
	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/internal/volume"
)

// InvalidSnapshots pages through the node's ListSnapshots: the IDs of the
// snapshots it reports not ready to use (carve's ListSnapshots says so
// only of a thick snapshot whose copy-on-write space ran out). A node is
// trusted only about its own snapshots: an ID that names another node is
// left out.
func (n auditNodes) InvalidSnapshots(ctx context.Context, node string) ([]string, error) {
	c, err := n.pool.Controller(ctx, node)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeCallTimeout)
	defer cancel()
	var out []string
	err = walkPages(func(token string) (proto.Message, string, int, error) {
		resp, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: token})
		for _, e := range resp.GetEntries() {
			s := e.GetSnapshot()
			if owner, _, _, perr := volume.ParseSnapshotID(s.GetSnapshotId()); perr != nil || owner != node {
				klog.FromContext(ctx).Error(nil, "Refused a node agent's answer: a snapshot that is not the node's", "node", node, "snapshotID", s.GetSnapshotId())
				continue
			}
			if !s.GetReadyToUse() {
				out = append(out, s.GetSnapshotId())
			}
		}
		return resp, resp.GetNextToken(), len(resp.GetEntries()), err
	})
	return out, err
}

// snapshotContents finds carve's VolumeSnapshotContents through the
// dynamic client (the audit asks only for snapshots that turned invalid,
// which is rare: one list each, no watch).
type snapshotContents struct {
	dyn    dynamic.Interface
	driver string
}

var _ audit.SnapshotContents = snapshotContents{}

func (s snapshotContents) ContentOf(ctx context.Context, id string) (*audit.SnapshotContent, error) {
	list, err := s.dyn.Resource(placement.VolumeSnapshotContents).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil, nil // no snapshot API in this cluster
	}
	if err != nil {
		return nil, fmt.Errorf("listing VolumeSnapshotContents: %w", err)
	}
	for i := range list.Items {
		o := list.Items[i].Object
		if driver, _, _ := unstructured.NestedString(o, "spec", "driver"); driver != s.driver {
			continue
		}
		handle, _, _ := unstructured.NestedString(o, "status", "snapshotHandle")
		if handle == "" {
			handle, _, _ = unstructured.NestedString(o, "spec", "source", "snapshotHandle")
		}
		if handle != id {
			continue
		}
		c := &audit.SnapshotContent{Name: list.Items[i].GetName(), UID: list.Items[i].GetUID()}
		ns, _, _ := unstructured.NestedString(o, "spec", "volumeSnapshotRef", "namespace")
		name, _, _ := unstructured.NestedString(o, "spec", "volumeSnapshotRef", "name")
		uid, _, _ := unstructured.NestedString(o, "spec", "volumeSnapshotRef", "uid")
		if ns != "" && name != "" {
			c.Snapshot, c.SnapshotUID = ns+"/"+name, types.UID(uid)
		}
		return c, nil
	}
	return nil, nil
}
