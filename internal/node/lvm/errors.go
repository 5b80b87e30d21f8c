package lvm

import (
	"errors"
	"fmt"
	"strings"

	"github.com/carve-csi/carve/internal/lvmname"
)

// Sentinel errors. Errors returned by this package wrap one of them when the
// cause is known, so callers test with errors.Is.
var (
	ErrNotFound          = errors.New("not found")
	ErrInsufficientSpace = errors.New("insufficient space")
	ErrAlreadyExists     = errors.New("already exists")
	ErrInvalidArgument   = lvmname.ErrInvalid
	// ErrInUse is an LV that cannot be removed because it is open
	// (mounted, or held by a process).
	ErrInUse = errors.New("in use")
	// ErrVolumeGroupNotFound is an ErrNotFound whose cause is that the
	// volume group itself is missing, not only the LV: a caller that must
	// not take "not found" as "gone for good" (deletion) tells the two
	// apart with errors.Is.
	ErrVolumeGroupNotFound = fmt.Errorf("volume group %w", ErrNotFound)
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
	var b strings.Builder
	fmt.Fprintf(&b, "lvm %s: ", strings.Join(e.Args, " "))
	if e.Err != nil {
		// Not run, or stopped (deadline): the exit code means nothing.
		b.WriteString(e.Err.Error())
	} else {
		fmt.Fprintf(&b, "exit code %d", e.ExitCode)
	}
	// LVM indents and wraps its messages; one line reads better in logs.
	var lines []string
	for _, l := range strings.Split(e.Stderr, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > 0 {
		b.WriteString(": ")
		b.WriteString(strings.Join(lines, "; "))
	}
	return b.String()
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
