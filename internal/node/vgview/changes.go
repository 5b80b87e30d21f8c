package vgview

import "sync"

// signal allocates nothing while nobody waits.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// Changes returns a channel closed at the view's next change. Take it before
// reading the view so no change is missed.
func (v *View) Changes() <-chan struct{} { return v.changes.wait() }
