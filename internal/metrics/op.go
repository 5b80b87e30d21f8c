package metrics

import (
	"sync"
	"time"
)

// UnknownClass is the device_class label of a phase whose volume's device
// class is not known (yet).
const UnknownClass = "unknown"

// Op times one phase of a CSI call and the steps it runs, so that a
// handler says once what it times instead of keeping start times and
// labels itself:
//
//	op := rec.Begin(metrics.PhaseStage, resultOf)
//	defer op.End(&err)
//	op.SetClass(class)
//	err = op.Step(metrics.StepMkfs, mkfs)
//
// An Op of a nil Recorder records nothing, and a nil *Op is one: its Step
// still runs the step. Its methods may be called from several goroutines
// (a stage job times its steps after its call has ended).
type Op struct {
	r      *Recorder
	phase  string
	start  time.Time
	result func(error) string

	mu    sync.Mutex
	class string
}

// Begin starts timing phase, of class UnknownClass until SetClass. result
// names the result label of the error the phase ends with: the CSI servers
// give the name of its gRPC code, so this package needs no gRPC.
func (r *Recorder) Begin(phase string, result func(error) string) *Op {
	return &Op{r: r, phase: phase, start: time.Now(), result: result, class: UnknownClass}
}

// SetClass sets the device class the phase and its later steps are
// labelled with; an empty class (not known) leaves the label as it is.
func (o *Op) SetClass(class string) {
	if o == nil || class == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.class = class
}

// Class is the device class label of the phase.
func (o *Op) Class() string {
	if o == nil {
		return UnknownClass
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.class
}

// Step runs fn as step of the phase and records how long it took and
// whether it failed; it returns fn's error.
func (o *Op) Step(step string, fn func() error) error {
	start := time.Now()
	err := fn()
	o.Took(step, time.Since(start), err)
	return err
}

// Took records a step timed where it ran (d long, ended with err).
func (o *Op) Took(step string, d time.Duration, err error) {
	if o == nil {
		return
	}
	o.r.ObserveStep(o.phase, step, o.Class(), d, err)
}

// End records the phase; err points at the error the call returns (nil
// or pointing at nil: success). It is meant for a defer with a named
// error result.
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
