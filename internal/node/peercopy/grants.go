package peercopy

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// The ways a read of a copy is refused.
var (
	// ErrUnknownCopy: never granted, already read, or lost with a restart.
	ErrUnknownCopy = errors.New("unknown copy")
	ErrExpired     = errors.New("copy grant expired")
	ErrWrongPeer   = errors.New("copy granted to another node")
)

// MaxGrants bounds the grants an agent holds against a runaway controller.
const MaxGrants = 1024

// Grant lets one node read one source of this node once.
type Grant struct {
	ID string
	// Source is the snapshot or volume ID; Snapshot tells which.
	Source   string
	Snapshot bool
	// TargetNode may read it; TargetName is the volume it makes.
	TargetNode, TargetName string
	// Base, for a catch-up, is a snapshot of Source; only what differs is sent.
	Base    string
	Expires time.Time
}

// Grants holds an agent's unused grants in memory only (the copy's retry
// asks anew after a restart); unread grants lapse and are counted.
type Grants struct {
	now     func() time.Time
	mu      sync.Mutex
	m       map[string]Grant
	expired uint64
}

// NewGrants returns an empty set; now nil is time.Now.
func NewGrants(now func() time.Time) *Grants {
	if now == nil {
		now = time.Now
	}
	return &Grants{now: now, m: map[string]Grant{}}
}

// Add records g; the same grant again is no error (a retried AuthorizeCopy).
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

// Take returns id's grant for peer and forgets it (read once). Another
// caller is refused and the grant kept, so no other node can spend it.
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

// Expired is how many grants lapsed unread.
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
