package driver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/state"
)

// toStatus maps an error from the lvm package (or the state view) to a gRPC
// status; it is the one place where domain errors become codes. what says
// what was being done, for the message. An error that already is a status
// is returned unchanged.
func toStatus(err error, what string) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	msg := fmt.Sprintf("%s: %v", what, err)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msg)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, msg)
	case errors.Is(err, lvm.ErrInsufficientSpace), errors.Is(err, state.ErrClassUnavailable), errors.Is(err, state.ErrNoRoom):
		// RESOURCE_EXHAUSTED makes external-provisioner pick another node,
		// and the kubelet retry an expansion later.
		return status.Error(codes.ResourceExhausted, msg)
	case errors.Is(err, state.ErrBeyondClass):
		// No retry can succeed: the capacity range must change.
		return status.Error(codes.OutOfRange, msg)
	case errors.Is(err, lvm.ErrNotFound):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, lvm.ErrAlreadyExists):
		return status.Error(codes.AlreadyExists, msg)
	case errors.Is(err, lvm.ErrInUse):
		return status.Error(codes.FailedPrecondition, msg)
	case errors.Is(err, lvm.ErrInvalidArgument):
		return status.Error(codes.InvalidArgument, msg)
	}
	return status.Error(codes.Internal, msg)
}
