package vgview

import "slices"

// Reason codes of Ready's errors: fixed words without LVM's text (paths,
// names, stderr), as /readyz answers unauthenticated callers with these
// only; the full error goes to the log and the authenticated Probe.
const (
	ReasonNotLoaded        = "not-loaded"         // no refresh has succeeded yet
	ReasonLVMTimeout       = "lvm-timeout"        // lvm did not answer in time, or no report came back for too long
	ReasonLVMError         = "lvm-error"          // reading LVM failed for a reason of no one volume group
	ReasonVGUnreadable     = "vg-unreadable"      // LVM cannot read a configured volume group
	ReasonVGMissing        = "vg-missing"         // a configured volume group does not exist
	ReasonPVMissing        = "pv-missing"         // a configured volume group lacks a physical volume
	ReasonThinPoolMissing  = "thin-pool-missing"  // a configured thin pool does not exist
	ReasonThinPoolUnusable = "thin-pool-unusable" // a configured thin pool is failed, read-only or partial
	ReasonUnknown          = "not-ready"          // an error that carries no reason
	// ReasonMetadataFull is not Ready's: the volumes serve on.
	ReasonMetadataFull = "metadata-full"
)

// NotReadyError is an error of Ready with its reason code.
type NotReadyError struct {
	Reason string
	Err    error
}

func (e *NotReadyError) Error() string { return e.Err.Error() }
func (e *NotReadyError) Unwrap() error { return e.Err }

func notReady(reason string, err error) error { return &NotReadyError{Reason: reason, Err: err} }

// Reasons are err's reason codes, sorted and unique.
func Reasons(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		//nolint:errorlint // walks the tree itself, one level at a time
		switch e := err.(type) {
		case nil:
		case *NotReadyError:
			out = append(out, e.Reason)
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			if inner := e.Unwrap(); inner != nil {
				walk(inner)
			} else {
				out = append(out, ReasonUnknown)
			}
		default:
			out = append(out, ReasonUnknown)
		}
	}
	walk(err)
	slices.Sort(out)
	return slices.Compact(out)
}
