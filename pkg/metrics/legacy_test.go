package metrics

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestObservePhaseLabelsResultWithGRPCCode(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, "OK"},
		{status.Error(codes.ResourceExhausted, "full"), "ResourceExhausted"},
		{fmt.Errorf("wrapped: %w", status.Error(codes.NotFound, "gone")), "NotFound"},
		{errors.New("plain"), "Internal"},
	}
	for _, tt := range tests {
		reg := prometheus.NewRegistry()
		r := NewRecorder(reg)
		r.ObservePhase(PhaseCreate, "fast", time.Millisecond, tt.err)
		got := sampleCount(t, reg, "carve_phase_duration_seconds", map[string]string{"phase": PhaseCreate, "device_class": "fast", "result": tt.want})
		if got != 1 {
			t.Errorf("err %v: count of result=%q is %d, want 1", tt.err, tt.want, got)
		}
	}
}
