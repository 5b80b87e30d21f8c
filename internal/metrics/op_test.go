package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// resultOf stands for the CSI servers' gRPC code names.
func resultOf(err error) string {
	if err != nil {
		return "Failed"
	}
	return "OK"
}

// TestOp: a phase is recorded once, at End, with the class set last and
// the result its caller names; its steps carry the class set before them.
func TestOp(t *testing.T) {
	failed := errors.New("failed")
	for _, tc := range []struct {
		name      string
		run       func(op *Op) error
		wantPhase map[string]string
		wantSteps []map[string]string
	}{
		{name: "class unknown until set",
			run:       func(*Op) error { return failed },
			wantPhase: map[string]string{"phase": PhaseStage, "device_class": UnknownClass, "result": "Failed"}},
		{name: "steps and class",
			run: func(op *Op) error {
				if err := op.Step(StepMkfs, func() error { return nil }); err != nil {
					return err
				}
				op.SetClass("fast")
				op.Took(StepMount, time.Millisecond, failed)
				return nil
			},
			wantPhase: map[string]string{"phase": PhaseStage, "device_class": "fast", "result": "OK"},
			wantSteps: []map[string]string{
				{"phase": PhaseStage, "step": StepMkfs, "device_class": UnknownClass, "result": "success"},
				{"phase": PhaseStage, "step": StepMount, "device_class": "fast", "result": "error"},
			}},
		{name: "a step's error is returned",
			run: func(op *Op) error {
				op.SetClass("thin")
				return op.Step(StepLVExtend, func() error { return failed })
			},
			wantPhase: map[string]string{"phase": PhaseStage, "device_class": "thin", "result": "Failed"},
			wantSteps: []map[string]string{{"phase": PhaseStage, "step": StepLVExtend, "device_class": "thin", "result": "error"}}},
		{name: "an empty class keeps the label",
			run: func(op *Op) error {
				op.SetClass("thin")
				op.SetClass("")
				return nil
			},
			wantPhase: map[string]string{"phase": PhaseStage, "device_class": "thin", "result": "OK"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r := NewRecorder(reg)
			err := func() (err error) {
				op := r.Begin(PhaseStage, resultOf)
				defer op.End(&err)
				return tc.run(op)
			}()
			if got := resultOf(err); got != tc.wantPhase["result"] {
				t.Errorf("the call returned %v, want a result of %s", err, tc.wantPhase["result"])
			}
			if got := sampleCount(t, reg, "carve_phase_duration_seconds", tc.wantPhase); got != 1 {
				t.Errorf("phase %v: count %d, want 1", tc.wantPhase, got)
			}
			for _, s := range tc.wantSteps {
				if got := sampleCount(t, reg, "carve_step_duration_seconds", s); got != 1 {
					t.Errorf("step %v: count %d, want 1", s, got)
				}
			}
		})
	}
}

// An Op of a nil Recorder, or a nil *Op, records nothing and still runs
// its steps.
func TestOpRecordsNothingWithoutRecorder(t *testing.T) {
	var r *Recorder
	for _, op := range []*Op{r.Begin(PhaseStage, resultOf), nil} {
		ran := false
		err := op.Step(StepMkfs, func() error { ran = true; return nil })
		op.SetClass("fast")
		op.Took(StepMount, time.Second, nil)
		var end error
		op.End(&end)
		op.End(nil)
		if !ran || err != nil {
			t.Errorf("Step ran %t, %v", ran, err)
		}
	}
	if got := (*Op)(nil).Class(); got != UnknownClass {
		t.Errorf("nil Op class %q", got)
	}
}
