package metrics

import (
	"sync"
	"time"
)

// UnknownClass labels a phase whose device class is not known yet.
const UnknownClass = "unknown"

// Op times one phase of a CSI call and its steps:
//
//	op := rec.Begin(metrics.PhaseStage, resultOf)
//	defer op.End(&err)
//	err = op.Step(metrics.StepMkfs, mkfs)
//
// An Op of a nil Recorder, or a nil *Op, records nothing but still runs
// steps. It is safe across goroutines (a stage job outlives its call).
type Op struct {
	r      *Recorder
	phase  string
	start  time.Time
	result func(error) string

	mu    sync.Mutex
	class string
}

// Begin starts timing phase; result names an error's result label.
func (r *Recorder) Begin(phase string, result func(error) string) *Op {
	return &Op{r: r, phase: phase, start: time.Now(), result: result, class: UnknownClass}
}

// SetClass labels the phase and later steps; "" leaves the label.
func (o *Op) SetClass(class string) {
	if o == nil || class == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.class = class
}

func (o *Op) Class() string {
	if o == nil {
		return UnknownClass
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.class
}

// Step runs fn as step of the phase, records it and returns fn's error.
func (o *Op) Step(step string, fn func() error) error {
	start := time.Now()
	err := fn()
	o.Took(step, time.Since(start), err)
	return err
}

// Took records a step timed where it ran.
func (o *Op) Took(step string, d time.Duration, err error) {
	if o == nil {
		return
	}
	o.r.ObserveStep(o.phase, step, o.Class(), d, err)
}

// End records the phase with *err (nil: success); meant for a defer.
func (o *Op) End(err *error) {
	if o == nil || o.r == nil {
		return
	}
	var e error
	if err != nil {
		e = *err
	}
	o.r.observePhase(o.phase, o.Class(), time.Since(o.start), o.result(e))
}
