package driver

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/node/vgview"
)

var kindCodes = map[error]codes.Code{
	provision.ErrBusy:        codes.Aborted,
	provision.ErrMismatch:    codes.AlreadyExists,
	provision.ErrNotFound:    codes.NotFound,
	provision.ErrElsewhere:   codes.ResourceExhausted,
	provision.ErrNoRoom:      codes.ResourceExhausted,
	provision.ErrUnavailable: codes.Unavailable,
	provision.ErrRefused:     codes.FailedPrecondition,
	provision.ErrOutOfRange:  codes.OutOfRange,
	provision.ErrInvalid:     codes.InvalidArgument,
	provision.ErrInternal:    codes.Internal,
}

// toStatus maps an error from internal/node/provision, the lvm package or the state
// view to a gRPC status; it is the one place where domain errors become
// codes. what, when not empty, says what was being done, for the message.
// An error that already is a status is returned unchanged.
func toStatus(err error, what string) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	msg := err.Error()
	if what != "" {
		msg = what + ": " + msg
	}
	return withReason(status.New(codeOf(err), msg), provision.ReasonOf(err)).Err()
}

// withReason is st with an ErrorInfo of carve's domain naming reason, the
// distinction its code does not make; st itself when reason is "".
func withReason(st *status.Status, reason string) *status.Status {
	if reason == "" {
		return st
	}
	d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: moveapi.ErrorDomain})
	if err != nil {
		return st
	}
	return d
}

func codeOf(err error) codes.Code {
	if pe := (*provision.Error)(nil); errors.As(err, &pe) {
		if c, ok := kindCodes[pe.Kind]; ok {
			return c
		}
		return codes.Internal
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, lvm.ErrInsufficientSpace), errors.Is(err, vgview.ErrClassUnavailable), errors.Is(err, vgview.ErrNoRoom):
		// RESOURCE_EXHAUSTED makes external-provisioner pick another node,
		// and the kubelet retry an expansion later.
		return codes.ResourceExhausted
	case errors.Is(err, vgview.ErrBeyondClass):
		// No retry can succeed: the capacity range must change.
		return codes.OutOfRange
	case errors.Is(err, lvm.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, lvm.ErrAlreadyExists):
		return codes.AlreadyExists
	case errors.Is(err, lvm.ErrInUse):
		return codes.FailedPrecondition
	case errors.Is(err, lvm.ErrInvalidArgument):
		return codes.InvalidArgument
	}
	return codes.Internal
}
