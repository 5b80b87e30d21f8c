package provision

import (
	"errors"
	"fmt"
)

// The kinds of the errors carve's volume lifecycle decides on. An *Error
// carries one; the CSI edge (internal/node/driver) turns each into a gRPC code, and
// passes lvm's and state's own errors (wrapped here with what was being
// done) through its same mapper.
var (
	// ErrBusy: an operation on the same volume is in flight, or the
	// volume is still being prepared; a retry later succeeds.
	ErrBusy = errors.New("busy")
	// ErrMismatch: a volume or snapshot of the name exists and is not the
	// one asked for again (another class, source, size or origin).
	ErrMismatch = errors.New("exists and does not match")
	// ErrNotFound: the named source, volume or snapshot does not exist on
	// this node.
	ErrNotFound = errors.New("not found")
	// ErrElsewhere: what is asked is for another node (a source that lives
	// there, a class this node lacks); the scheduler should pick again.
	ErrElsewhere = errors.New("on another node")
	// ErrNoRoom: the device class has no room for the volume or snapshot
	// now.
	ErrNoRoom = errors.New("no room")
	// ErrUnavailable: what is needed cannot be known or reached now (a
	// missing volume group, an unavailable class, a cache not yet
	// filled); a retry later may succeed.
	ErrUnavailable = errors.New("unavailable")
	// ErrRefused: the state of the volume or its source forbids the
	// operation (not carve's, in use, has snapshots, a copy pending, a
	// snapshot that ran out of space).
	ErrRefused = errors.New("refused")
	// ErrOutOfRange: the asked capacity range cannot be met.
	ErrOutOfRange = errors.New("out of range")
	// ErrInvalid: the request is malformed.
	ErrInvalid = errors.New("invalid")
	// ErrInternal: carve's own state (a mark, the copier) failed.
	ErrInternal = errors.New("internal")
)

// Error is an error of one of the kinds above; its message is the one a
// user sees, without the kind's name.
type Error struct {
	Kind error
	Msg  string
	// Reason, when set, is one of moveapi's Error* reasons: what the
	// kind's code alone does not tell a caller that decides on it (the
	// edge puts it in the status as an ErrorInfo).
	Reason string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the kind, so that errors.Is(err, ErrBusy) works.
func (e *Error) Unwrap() error { return e.Kind }

// errorf returns an *Error of kind. Any %w in format is formatted as %v:
// the kind alone decides how the error is answered.
func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Errorf is errorf for the edge's own checks that share these kinds.
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

// wrap says what was being done when err (from lvm or the view) happened;
// an *Error, already meant for the user, is returned as it is.
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
