package lvm

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Errors returned by this package wrap one of them when the
// cause is known, so callers test with errors.Is.
var (
	ErrNotFound          = errors.New("not found")
	ErrInsufficientSpace = errors.New("insufficient space")
	ErrAlreadyExists     = errors.New("already exists")
	ErrInvalidArgument   = errors.New("invalid argument")
	// ErrInUse is an LV that cannot be removed because it is open
	// (mounted, or held by a process).
	ErrInUse = errors.New("in use")
)

// CommandError is a failed lvm command: its arguments, exit code and stderr.
type CommandError struct {
	Args     []string
	ExitCode int
	Stderr   string
	// Kind is one of the sentinel errors when the failure was classified,
	// nil otherwise.
	Kind error
	Err  error
}

func (e *CommandError) Error() string {
	return fmt.Sprintf("lvm %s: exit code %d: %s", strings.Join(e.Args, " "), e.ExitCode, strings.TrimSpace(e.Stderr))
}

// Unwrap lets errors.Is find both the classification and the exec error.
func (e *CommandError) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}
