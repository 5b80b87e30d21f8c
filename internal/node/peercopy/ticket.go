package peercopy

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/nodeca"
)

// The gRPC metadata keys of a ticket: the grant of a copy across nodes
// that carve controller sends with a CreateVolume to the target node.
const (
	mdCopyID  = "carve-copy-id"
	mdSource  = "carve-copy-source"
	mdKind    = "carve-copy-source-kind"
	mdNode    = "carve-copy-source-node"
	mdAddress = "carve-copy-source-address"
	mdSize    = "carve-copy-source-size"
)

// The kinds of source in mdKind.
const (
	kindSnapshot = "snapshot"
	kindVolume   = "volume"
)

// Metadata is rs as the key-value pairs of outgoing gRPC metadata
// (metadata.AppendToOutgoingContext).
func Metadata(rs provision.RemoteSource) []string {
	kind := kindVolume
	if rs.Snapshot {
		kind = kindSnapshot
	}
	return []string{mdCopyID, rs.CopyID, mdSource, rs.ID, mdKind, kind, mdNode, rs.Node,
		mdAddress, rs.Address, mdSize, strconv.FormatUint(rs.Size, 10)}
}

// FromMetadata reads a ticket from incoming metadata: nil when there is
// none, an error naming the key when one is malformed.
func FromMetadata(md metadata.MD) (*provision.RemoteSource, error) {
	get := func(k string) string {
		if v := md.Get(k); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	id := get(mdCopyID)
	if id == "" {
		return nil, nil
	}
	rs := &provision.RemoteSource{CopyID: id, ID: get(mdSource), Node: get(mdNode), Address: get(mdAddress)}
	switch get(mdKind) {
	case kindSnapshot:
		rs.Snapshot = true
	case kindVolume:
	default:
		return nil, fmt.Errorf("metadata %s: %q is neither %s nor %s", mdKind, get(mdKind), kindSnapshot, kindVolume)
	}
	if rs.ID == "" {
		return nil, fmt.Errorf("metadata %s: must be set", mdSource)
	}
	if err := nodeca.ValidateNodeName(rs.Node); err != nil {
		return nil, fmt.Errorf("metadata %s: %w", mdNode, err)
	}
	if _, _, err := net.SplitHostPort(rs.Address); err != nil {
		return nil, fmt.Errorf("metadata %s: %w", mdAddress, err)
	}
	size, err := strconv.ParseUint(get(mdSize), 10, 64)
	if err != nil || size == 0 {
		return nil, fmt.Errorf("metadata %s: %q is not a size in bytes", mdSize, get(mdSize))
	}
	rs.Size = size
	return rs, nil
}

// TicketInterceptor puts the ticket a CreateVolume carries into its
// context (provision.WithRemoteSource). Install it on the node channel
// only: there, only carve controller reaches CreateVolume.
func TicketInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != csi.Controller_CreateVolume_FullMethodName {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	rs, err := FromMetadata(md)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the copy from another node: %v", err)
	}
	if rs != nil {
		ctx = provision.WithRemoteSource(ctx, rs)
	}
	return handler(ctx, req)
}
