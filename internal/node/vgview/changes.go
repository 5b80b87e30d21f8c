package vgview

import "sync"

// signal tells waiters that something changed: each Wait channel is closed
// at the next Fire. Nothing is allocated while nobody waits, so a view
// that no one watches pays one mutex per change.
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

// fire wakes every waiter; fires with nobody waiting in between coalesce.
func (s *signal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// Changes returns a channel that is closed at the view's next change: a
// refresh (successful or not), or Created, Removed or Extended. Take it
// before reading the view, then wait on it, so that no change between the
// read and the wait is missed; several changes before the wait coalesce
// into one wake-up. A change may leave every value as it was: the reader
// compares.
func (v *View) Changes() <-chan struct{} { return v.changes.wait() }
