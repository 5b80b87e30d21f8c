package nodestatus

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision"
)

// Every kind of provision's errors has its code, and its message reaches
// the user as it is; wrapped lvm errors keep their code and say what was
// being done.
func TestOfKinds(t *testing.T) {
	for kind, code := range kindCodes {
		err := Of(provision.Errorf(kind, "volume %q: why", "pvc-1"), "")
		if status.Code(err) != code || status.Convert(err).Message() != `volume "pvc-1": why` {
			t.Errorf("%v: got %v, want %v with the message unchanged", kind, err, code)
		}
	}
	err := Of(fmt.Errorf("removing vg1/lv: %w", lvm.ErrInUse), "")
	if status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "removing vg1/lv: "+lvm.ErrInUse.Error() {
		t.Errorf("wrapped lvm.ErrInUse: %v", err)
	}
	if len(kindCodes) != 10 {
		t.Errorf("%d kinds mapped, want the 10 of internal/node/provision", len(kindCodes))
	}
}

func TestOf(t *testing.T) {
	tests := []struct {
		err  error
		code codes.Code
	}{
		{status.Error(codes.Aborted, "x"), codes.Aborted},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{errors.New("boom"), codes.Internal},
	}
	for _, tt := range tests {
		if got := status.Code(Of(tt.err, "doing")); got != tt.code {
			t.Errorf("Of(%v) = %v, want %v", tt.err, got, tt.code)
		}
	}
	if Of(nil, "x") != nil {
		t.Error("Of(nil) != nil")
	}
}

// A provision error with a reason carries it as an ErrorInfo of carve's
// domain; one without carries no details.
func TestOfReason(t *testing.T) {
	err := Of(&provision.Error{Kind: provision.ErrBusy, Msg: "copying", Reason: moveapi.ErrorCopyInProgress}, "")
	st := status.Convert(err)
	var got []string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == moveapi.ErrorDomain {
			got = append(got, info.GetReason())
		}
	}
	if st.Code() != codes.Aborted || len(got) != 1 || got[0] != moveapi.ErrorCopyInProgress {
		t.Errorf("got %v with reasons %v, want ABORTED with %s", err, got, moveapi.ErrorCopyInProgress)
	}
	if d := status.Convert(Of(provision.Errorf(provision.ErrBusy, "busy"), "")).Details(); len(d) != 0 {
		t.Errorf("details %v on an error without a reason", d)
	}
}

// What lives on another node is RESOURCE_EXHAUSTED on a CSI call (the
// provisioner picks another node) and NOT_FOUND on a read for a peer.
func TestElsewhere(t *testing.T) {
	err := provision.Errorf(provision.ErrElsewhere, "snapshot s lives on node b")
	if got := status.Code(Of(err, "")); got != codes.ResourceExhausted {
		t.Errorf("Of: %v, want ResourceExhausted", got)
	}
	if got := status.Code(OfRead(fmt.Errorf("reading: %w", err), "")); got != codes.NotFound {
		t.Errorf("OfRead: %v, want NotFound", got)
	}
	if got := status.Code(OfRead(provision.Errorf(provision.ErrBusy, "b"), "")); got != codes.Aborted {
		t.Errorf("OfRead of a busy error: %v, want Aborted", got)
	}
}
