package lvm

import (
	"context"
	"sync"
)

// VGLocks is a set of per-volume-group locks whose waiting honours the
// caller's context. The zero value is ready to use. The Client's own set
// serializes the mutations of each volume group inside the process.
// LVM locks a VG itself, but only for the length of one command; carve's
// mutations are read-decide-write sequences (extend reads the size first, a
// failed create reads the free space to classify the failure) that must not
// interleave with another mutation of the same VG. Reads never take these
// locks, so a report is never stuck behind a long lvcreate. Waiting honours
// the context, so a caller whose deadline passes gives up instead of
// queueing forever.
type VGLocks struct {
	mu    sync.Mutex
	locks map[string]*vgLock
}

type vgLock struct {
	sem  chan struct{} // capacity 1: holding the token is holding the lock
	refs int           // holders and waiters; the entry goes when it drops to 0
}

// Lock takes the lock of vg and returns the function that releases it;
// ctx's error when ctx ends first.
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
