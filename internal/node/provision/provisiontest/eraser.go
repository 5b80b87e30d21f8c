package provisiontest

import (
	"context"
	"slices"
	"sync"

	"github.com/carve-csi/carve/internal/node/erase"
)

// Eraser records erasures instead of erasing; a set Gate holds each until
// closed, Fail fails them. Tests hold Mu to touch its fields.
type Eraser struct {
	Mu    sync.Mutex
	calls []Erased
	Gate  chan struct{}
	// Reached, when set, gets a value each time an erasure reaches Gate.
	Reached chan struct{}
	Fail    error
	// Observe, when set, sees each erasure before it is recorded.
	Observe func(path string, m erase.Method)
}

// Erased is one erasure an Eraser recorded.
type Erased struct {
	Path   string
	Method erase.Method
}

// Erase implements erase.Eraser.
func (e *Eraser) Erase(ctx context.Context, path string, m erase.Method) (int64, error) {
	e.Mu.Lock()
	gate, fail, reached, observe := e.Gate, e.Fail, e.Reached, e.Observe
	e.Mu.Unlock()
	if observe != nil {
		observe(path, m)
	}
	if gate != nil {
		if reached != nil {
			reached <- struct{}{}
		}
		<-gate
	}
	if fail != nil {
		return 0, fail
	}
	e.Mu.Lock()
	defer e.Mu.Unlock()
	e.calls = append(e.calls, Erased{path, m})
	return 1, nil
}

// Erasures lists the erasures done, in order.
func (e *Eraser) Erasures() []Erased {
	e.Mu.Lock()
	defer e.Mu.Unlock()
	return slices.Clone(e.calls)
}
