// Package volumelock keeps at most one operation in flight per volume.
//
// It does not block: a second operation on a busy key fails at once, and the
// CSI servers answer it with ABORTED ("an operation is pending for this
// volume"), which the sidecars retry with backoff. Blocking instead would
// let retries pile up behind a slow lvcreate or mkfs, each holding a
// goroutine and a deadline that expires while it waits.
package volumelock

import (
	"slices"
	"sync"
)

// Locks is a set of keyed locks. The zero value is not usable; use New.
type Locks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

// New returns an empty set of locks.
func New() *Locks { return &Locks{held: map[string]struct{}{}} }

// TryAcquire takes the lock of key. It returns false, and takes nothing,
// when the key is already held.
func (l *Locks) TryAcquire(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.held[key]; busy {
		return false
	}
	l.held[key] = struct{}{}
	return true
}

// Release frees key. Releasing a key that is not held does nothing.
func (l *Locks) Release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, key)
}

// IsHeld tells whether key is held now.
func (l *Locks) IsHeld(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, busy := l.held[key]
	return busy
}

// Held tells how many keys are held (for tests and logs).
func (l *Locks) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// Keys returns the keys held now, sorted.
func (l *Locks) Keys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.held))
	for k := range l.held {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
