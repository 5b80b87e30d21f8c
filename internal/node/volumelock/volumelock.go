// Package volumelock keeps at most one operation in flight per volume. A
// second one fails at once, answered ABORTED, which the sidecars retry with
// backoff: blocking would pile retries up behind a slow lvcreate or mkfs,
// each holding a goroutine and an expiring deadline.
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

// TryAcquire takes key's lock, or returns false when it is held.
func (l *Locks) TryAcquire(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.held[key]; busy {
		return false
	}
	l.held[key] = struct{}{}
	return true
}

// Release frees key; a key not held is left alone.
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

// Held tells how many keys are held.
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
