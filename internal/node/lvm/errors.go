package lvm

import (
	"errors"
	"fmt"
	"strings"

	"github.com/carve-csi/carve/internal/lvmname"
)

// Sentinel errors; this package's errors wrap one when the cause is known.
var (
	ErrNotFound          = errors.New("not found")
	ErrInsufficientSpace = errors.New("insufficient space")
	ErrAlreadyExists     = errors.New("already exists")
	ErrInvalidArgument   = lvmname.ErrInvalid
	// ErrInUse is an open LV that cannot be removed.
	ErrInUse = errors.New("in use")
	// ErrVolumeGroupNotFound is an ErrNotFound of the whole VG: a deletion must
	// not take it as "gone for good".
	ErrVolumeGroupNotFound = fmt.Errorf("volume group %w", ErrNotFound)
)

// CommandError is a failed lvm command: its arguments, exit code and stderr.
type CommandError struct {
	Args     []string
	ExitCode int
	Stderr   string
	// Kind is the sentinel the failure was classified as, or nil.
	Kind error
	Err  error
}

func (e *CommandError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "lvm %s: ", strings.Join(e.Args, " "))
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		fmt.Fprintf(&b, "exit code %d", e.ExitCode)
	}
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

// Unwrap returns the classification and the exec error.
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
