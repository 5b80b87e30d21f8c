package router

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/carve-csi/carve/internal/controller/paging"
	"github.com/carve-csi/carve/internal/volume"
)

// Lists are served because node agents advertise them and csi-sanity and
// health monitors read them through the controller. A list walks connected
// nodes in name order; its token is "<node>/<node's token>", resuming on that
// node (or the next when it is gone) with the node's own guarantees. An
// unconnected node is not listed; one failing mid-list fails the page, since
// a partial page cannot say what it lacks.

// pager asks node for a page of at most limit entries (0: all) from token.
type pager[E any] func(ctx context.Context, node, token string, limit int32) ([]E, string, error)

// fanList pages through nodes from token, at most limit entries (0: all),
// and the next token ("" at the end). A node past paging's limits or
// repeating a token fails the list.
func fanList[E proto.Message](ctx context.Context, s *Server, method string, nodes []string, token string, limit int32, page pager[E]) ([]E, string, error) {
	if limit < 0 {
		return nil, "", status.Errorf(codes.InvalidArgument, "max_entries: %d is negative", limit)
	}
	from, inner, err := parseToken(token)
	if err != nil {
		return nil, "", err
	}
	nodes = slices.Sorted(slices.Values(nodes))
	var out []E
	for i, n := range nodes {
		if n < from {
			continue
		}
		tok := ""
		if n == from {
			tok = inner
		}
		walk := paging.New(s.limits(), tok)
		for {
			want := int32(0)
			if limit > 0 {
				want = limit - int32(len(out))
			}
			entries, next, err := page(ctx, n, tok, want)
			if err != nil {
				return nil, "", err
			}
			size := 0
			for _, e := range entries {
				size += proto.Size(e)
			}
			if err := walk.Page(len(entries), size, next); err != nil {
				return nil, "", s.refuse(ctx, n, method, refusedPaging, "pages past the limits: %v", err)
			}
			out = append(out, entries...)
			if next == "" {
				break
			}
			if limit > 0 && len(out) >= int(limit) {
				return out, n + "/" + next, nil
			}
			tok = next
		}
		if limit > 0 && len(out) >= int(limit) && i+1 < len(nodes) {
			return out, nodes[i+1] + "/", nil
		}
	}
	return out, "", nil
}

// parseToken splits a list token; one carve did not hand out is Aborted.
func parseToken(token string) (node, inner string, err error) {
	if token == "" {
		return "", "", nil
	}
	node, inner, ok := strings.Cut(token, "/")
	if !ok || node == "" {
		return "", "", status.Errorf(codes.Aborted, "starting_token %q was not returned by carve", token)
	}
	return node, inner, nil
}

// ListVolumes implements csi.ControllerServer over every connected node.
func (s *Server) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	entries, next, err := fanList(ctx, s, "ListVolumes", s.cfg.Nodes.Names(), req.GetStartingToken(), req.GetMaxEntries(),
		func(ctx context.Context, node, token string, limit int32) ([]*csi.ListVolumesResponse_Entry, string, error) {
			r, err := send(ctx, s, node, "ListVolumes", csi.ControllerClient.ListVolumes,
				&csi.ListVolumesRequest{MaxEntries: limit, StartingToken: token}, codes.Unavailable)
			return s.ownVolumes(ctx, node, r.GetEntries()), r.GetNextToken(), err
		})
	if err != nil {
		return nil, err
	}
	return &csi.ListVolumesResponse{Entries: entries, NextToken: next}, nil
}

// ControllerListVolumeHealth implements csi.ControllerServer over every
// connected node.
func (s *Server) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	entries, next, err := fanList(ctx, s, "ControllerListVolumeHealth", s.cfg.Nodes.Names(), req.GetStartingToken(), req.GetMaxEntries(),
		func(ctx context.Context, node, token string, limit int32) ([]*csi.VolumeHealth, string, error) {
			r, err := send(ctx, s, node, "ControllerListVolumeHealth", csi.ControllerClient.ControllerListVolumeHealth,
				&csi.ControllerListVolumeHealthRequest{MaxEntries: limit, StartingToken: token}, codes.Unavailable)
			return r.GetEntries(), r.GetNextToken(), err
		})
	if err != nil {
		return nil, err
	}
	return &csi.ControllerListVolumeHealthResponse{Entries: entries, NextToken: next}, nil
}

// ListSnapshots implements csi.ControllerServer on the node snapshot_id or
// source_volume_id names, else every connected node.
func (s *Server) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	nodes, err := s.snapshotNodes(ctx, req)
	if errors.Is(err, errNoVolume) {
		return &csi.ListSnapshotsResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	entries, next, err := fanList(ctx, s, "ListSnapshots", nodes, req.GetStartingToken(), req.GetMaxEntries(),
		func(ctx context.Context, node, token string, limit int32) ([]*csi.ListSnapshotsResponse_Entry, string, error) {
			r, err := send(ctx, s, node, "ListSnapshots", csi.ControllerClient.ListSnapshots,
				&csi.ListSnapshotsRequest{MaxEntries: limit, StartingToken: token, SnapshotId: req.GetSnapshotId(),
					SourceVolumeId: req.GetSourceVolumeId(), Secrets: req.GetSecrets()}, codes.Unavailable)
			return s.ownSnapshots(ctx, node, r.GetEntries()), r.GetNextToken(), err
		})
	if err != nil {
		return nil, err
	}
	return &csi.ListSnapshotsResponse{Entries: entries, NextToken: next}, nil
}

// snapshotNodes are the nodes to ask; errNoVolume when the filter names
// nothing of carve's.
func (s *Server) snapshotNodes(ctx context.Context, req *csi.ListSnapshotsRequest) ([]string, error) {
	if id := req.GetSnapshotId(); id != "" {
		node, _, _, err := volume.ParseSnapshotID(id)
		if err != nil {
			return nil, errNoVolume
		}
		return []string{node}, nil
	}
	if id := req.GetSourceVolumeId(); id != "" {
		node, err := s.nodeOfVolume(ctx, id)
		if err != nil {
			return nil, err
		}
		return []string{node}, nil
	}
	return s.cfg.Nodes.Names(), nil
}
