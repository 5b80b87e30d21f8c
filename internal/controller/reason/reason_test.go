package reason

import (
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/api/moveapi"
)

func withReason(t *testing.T, code codes.Code, domain, why string) error {
	t.Helper()
	st, err := status.New(code, "refused").WithDetails(&errdetails.ErrorInfo{Domain: domain, Reason: why})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

func TestCopyInProgress(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		reason string
		want   bool
	}{
		{"carve's reason on ABORTED", withReason(t, codes.Aborted, moveapi.ErrorDomain, moveapi.ErrorCopyInProgress), moveapi.ErrorCopyInProgress, true},
		{"the reason on another code", withReason(t, codes.FailedPrecondition, moveapi.ErrorDomain, moveapi.ErrorCopyInProgress), moveapi.ErrorCopyInProgress, false},
		{"another domain's reason", withReason(t, codes.Aborted, "example.com", moveapi.ErrorCopyInProgress), "", false},
		{"ABORTED without a reason", status.Error(codes.Aborted, "busy"), "", false},
		{"no status", errors.New("plain"), "", false},
		{"nil", nil, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Of(tt.err); got != tt.reason {
				t.Errorf("Of = %q, want %q", got, tt.reason)
			}
			if got := CopyInProgress(tt.err); got != tt.want {
				t.Errorf("CopyInProgress = %v, want %v", got, tt.want)
			}
		})
	}
}
