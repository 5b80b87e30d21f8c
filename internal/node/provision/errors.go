package provision

import (
	"errors"
	"fmt"
)

// The kinds of lifecycle errors; the CSI edge maps each to a gRPC code.
var (
	// ErrBusy: an operation on the volume is in flight; retry later.
	ErrBusy = errors.New("busy")
	// ErrMismatch: the name exists as another volume or snapshot.
	ErrMismatch = errors.New("exists and does not match")
	// ErrNotFound: not on this node.
	ErrNotFound = errors.New("not found")
	// ErrElsewhere: for another node; the scheduler should pick again.
	ErrElsewhere = errors.New("on another node")
	// ErrNoRoom: the device class has no room now.
	ErrNoRoom = errors.New("no room")
	// ErrUnavailable: cannot be known or reached now; a retry may succeed.
	ErrUnavailable = errors.New("unavailable")
	// ErrRefused: the state of the volume or its source forbids it.
	ErrRefused = errors.New("refused")
	// ErrOutOfRange: the asked capacity range cannot be met.
	ErrOutOfRange = errors.New("out of range")
	// ErrInvalid: the request is malformed.
	ErrInvalid = errors.New("invalid")
	// ErrInternal: carve's own state (a mark, the copier) failed.
	ErrInternal = errors.New("internal")
)

// Error is an error of one kind; its message is what a user sees.
type Error struct {
	Kind error
	Msg  string
	// Reason is a moveapi Error* reason, sent as an ErrorInfo.
	Reason string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the kind, for errors.Is.
func (e *Error) Unwrap() error { return e.Kind }

// errorf formats %w as %v: the kind alone decides the answer.
func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Errorf is errorf for the edge's own checks.
func Errorf(kind error, format string, args ...any) error { return errorf(kind, format, args...) }

func reasonf(kind error, reason, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...), Reason: reason}
}

// ReasonOf is the Reason of the *Error err wraps, or "".
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// wrap says what was being done; an *Error is returned as it is.
func wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}
