// Package nodestatus maps the node agent's domain errors to gRPC statuses:
// the one table every service of the agent answers by.
package nodestatus

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

// Of maps an error of provision, lvm or the view to a gRPC status; what says
// what was being done. A status passes unchanged. provision.ErrElsewhere is
// RESOURCE_EXHAUSTED: the provisioner picks another node.
func Of(err error, what string) error {
	return of(err, what, codes.ResourceExhausted)
}

// OfRead is Of for reads on behalf of a peer or the controller: another
// node's item is NOT_FOUND, like any name this node does not hold.
func OfRead(err error, what string) error {
	return of(err, what, codes.NotFound)
}

func of(err error, what string, elsewhere codes.Code) error {
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
	code := codeOf(err)
	if errors.Is(err, provision.ErrElsewhere) {
		code = elsewhere
	}
	return WithReason(status.New(code, msg), provision.ReasonOf(err)).Err()
}

// WithReason adds an ErrorInfo naming reason, which the code does not tell;
// st itself for "".
func WithReason(st *status.Status, reason string) *status.Status {
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
