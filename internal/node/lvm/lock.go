package lvm

import (
	"context"
	"sync"
)

// VGLocks is a set of per-VG locks whose waiting honours the context; the
// zero value is ready. LVM locks a VG for one command only, while carve's
// mutations read, decide and write and must not interleave. Reads never
// take them, so a report never waits behind a long lvcreate.
type VGLocks struct {
	mu    sync.Mutex
	locks map[string]*vgLock
}

type vgLock struct {
	sem  chan struct{} // capacity 1: holding the token is holding the lock
	refs int           // holders and waiters; the entry goes when it drops to 0
}

// Lock takes vg's lock and returns its release.
func (l *VGLocks) Lock(ctx context.Context, vg string) (func(), error) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[string]*vgLock{}
	}
	e := l.locks[vg]
	if e == nil {
		e = &vgLock{sem: make(chan struct{}, 1)}
		l.locks[vg] = e
	}
	e.refs++
	l.mu.Unlock()

	release := func() {
		l.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(l.locks, vg)
		}
		l.mu.Unlock()
	}
	select {
	case e.sem <- struct{}{}:
		return func() { <-e.sem; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// Size is the number of volume groups with a holder or a waiter.
func (l *VGLocks) Size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.locks)
}
