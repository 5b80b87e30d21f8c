package channel

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// catchUpFunc is a CatchUps.
type catchUpFunc func(context.Context, *nodeagentv1.CatchUpCopyRequest) (*nodeagentv1.CatchUpCopyResponse, error)

func (f catchUpFunc) CatchUpCopy(ctx context.Context, req *nodeagentv1.CatchUpCopyRequest) (*nodeagentv1.CatchUpCopyResponse, error) {
	return f(ctx, req)
}

// TestCatchUpCopy: an agent without CatchUps answers UNIMPLEMENTED; one
// with them hands the call over, its answer unchanged.
func TestCatchUpCopy(t *testing.T) {
	req := &nodeagentv1.CatchUpCopyRequest{TargetVolumeId: "vg/carve-1"}
	tests := []struct {
		name     string
		catchUps CatchUps
		want     codes.Code
	}{
		{name: "no catch-ups", want: codes.Unimplemented},
		{name: "caught up", catchUps: catchUpFunc(func(_ context.Context, r *nodeagentv1.CatchUpCopyRequest) (*nodeagentv1.CatchUpCopyResponse, error) {
			if r != req {
				t.Errorf("got %v", r)
			}
			return &nodeagentv1.CatchUpCopyResponse{ReceivedBytes: 7}, nil
		})},
		{name: "refused", catchUps: catchUpFunc(func(context.Context, *nodeagentv1.CatchUpCopyRequest) (*nodeagentv1.CatchUpCopyResponse, error) {
			return nil, status.Error(codes.FailedPrecondition, "open")
		}), want: codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &Agent{cfg: Config{NodeName: node, CatchUps: tt.catchUps}}
			resp, err := a.CatchUpCopy(t.Context(), req)
			if status.Code(err) != tt.want {
				t.Fatalf("CatchUpCopy: %v, want %s", err, tt.want)
			}
			if err == nil && resp.GetReceivedBytes() != 7 {
				t.Errorf("response %v", resp)
			}
		})
	}
}
