package peercopy

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/copyticket"
	"github.com/carve-csi/carve/internal/node/provision"
)

// TicketInterceptor puts a CreateVolume's ticket into its context. Install it
// on the node channel only, where only carve controller calls CreateVolume.
func TicketInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != csi.Controller_CreateVolume_FullMethodName {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	rs, err := copyticket.FromMetadata(md)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the copy from another node: %v", err)
	}
	if rs != nil {
		ctx = provision.WithRemoteSource(ctx, rs)
	}
	return handler(ctx, req)
}
