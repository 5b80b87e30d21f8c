package peercopy

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// The ways a read of a copy is refused.
var (
	// ErrUnknownCopy: no grant has the copy ID (never granted, already
	// read, or forgotten by a restart of the agent).
	ErrUnknownCopy = errors.New("unknown copy")
	// ErrExpired: the grant was not used in time.
	ErrExpired = errors.New("copy grant expired")
	// ErrWrongPeer: the caller is not the node the grant is for.
	ErrWrongPeer = errors.New("copy granted to another node")
)

// MaxGrants bounds the grants an agent holds: each is a few hundred bytes,
// and only the controller makes them, but a bound keeps a runaway one
// from growing the agent's memory.
const MaxGrants = 1024

// Grant lets one node read one source of this node once.
type Grant struct {
	// ID is the copy's ID, random, chosen by the controller.
	ID string
	// Source is the snapshot or volume ID; Snapshot tells which.
	Source   string
	Snapshot bool
	// TargetNode may read it; TargetName is the CSI name of the volume
	// it makes.
	TargetNode, TargetName string
	// Base, for a catch-up, is a snapshot of the volume Source: only
	// what differs from it is sent (delta.go).
	Base string
	// Expires is when the grant lapses unused.
	Expires time.Time
}

// Grants holds an agent's unused grants in memory only (a restarted agent
// has none; the copy's retry asks anew); unread grants lapse at expiry and
// are counted (Expired).
type Grants struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[string]Grant
	// expired counts the grants dropped unread at their expiry.
	expired uint64
}

// NewGrants returns an empty set; now nil is time.Now.
func NewGrants(now func() time.Time) *Grants {
	if now == nil {
		now = time.Now
	}
	return &Grants{now: now, m: map[string]Grant{}}
}

// Add records g. The same grant again is no error (a retried
// AuthorizeCopy); another with g's ID is.
func (s *Grants) Add(g Grant) error {
	if g.ID == "" || g.Source == "" || g.TargetNode == "" || g.TargetName == "" {
		return errors.New("a grant needs an ID, a source, a target node and a target volume name")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	if o, ok := s.m[g.ID]; ok {
		if o != g {
			return fmt.Errorf("copy %s: granted already for another source or target", g.ID)
		}
		return nil
	}
	if len(s.m) >= MaxGrants {
		return fmt.Errorf("%d copy grants wait for their read already", len(s.m))
	}
	s.m[g.ID] = g
	return nil
}

// Take returns the grant of id for a read by node peer and forgets it:
// a grant is read once. A caller that is not its target is refused and
// the grant kept (so that another node cannot spend it).
func (s *Grants) Take(id, peer string) (Grant, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.m[id]
	if !ok {
		return Grant{}, fmt.Errorf("copy %q: %w", id, ErrUnknownCopy)
	}
	if !s.now().Before(g.Expires) {
		delete(s.m, id)
		s.expired++
		return Grant{}, fmt.Errorf("copy %q: %w at %s", id, ErrExpired, g.Expires.UTC().Format(time.RFC3339))
	}
	if g.TargetNode != peer {
		return Grant{}, fmt.Errorf("copy %q: node %s asked; %w (%s)", id, peer, ErrWrongPeer, g.TargetNode)
	}
	delete(s.m, id)
	return g, nil
}

// Len is how many grants wait for their read, the expired ones dropped.
func (s *Grants) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	return len(s.m)
}

// Expired is how many grants lapsed unread since the set was made, the
// ones expired by now included.
func (s *Grants) Expired() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked()
	return s.expired
}

func (s *Grants) sweepLocked() {
	now := s.now()
	for id, g := range s.m {
		if !now.Before(g.Expires) {
			delete(s.m, id)
			s.expired++
		}
	}
}
