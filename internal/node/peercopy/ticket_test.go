package peercopy

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/copyticket"
	"github.com/carve-csi/carve/internal/node/provision"
)

// TestTicketInterceptor: CreateVolume gets the ticket in its context,
// other calls are untouched, a malformed ticket is INVALID_ARGUMENT.
func TestTicketInterceptor(t *testing.T) {
	rs := provision.RemoteSource{CopyID: "c1", ID: "vg/v", Node: "node-a", Address: "10.0.0.1:9811", Size: 4096}
	create := &grpc.UnaryServerInfo{FullMethod: csi.Controller_CreateVolume_FullMethodName}
	var seen bool
	handler := func(ctx context.Context, _ any) (any, error) {
		got := provision.RemoteSourceFrom(ctx)
		seen = got != nil && *got == rs
		return nil, nil
	}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(copyticket.Metadata(rs)...))
	if _, err := TicketInterceptor(ctx, nil, create, handler); err != nil || !seen {
		t.Errorf("CreateVolume with a ticket: %v", err)
	}
	bad := metadata.Pairs(copyticket.Metadata(rs)...)
	bad.Set("carve-copy-source-size", "x")
	if _, err := TicketInterceptor(metadata.NewIncomingContext(t.Context(), bad), nil, create, handler); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a malformed ticket: %v, want INVALID_ARGUMENT", err)
	}
	other := &grpc.UnaryServerInfo{FullMethod: csi.Controller_DeleteVolume_FullMethodName}
	seen = true
	if _, err := TicketInterceptor(metadata.NewIncomingContext(t.Context(), bad), nil, other, handler); err != nil || seen {
		t.Errorf("DeleteVolume with a malformed ticket: %v (not read there)", err)
	}
}
