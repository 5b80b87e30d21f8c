package peercopy

import (
	"errors"
	"testing"
	"time"
)

// TestGrants: a grant is read once, by its target node only, before it
// expires.
func TestGrants(t *testing.T) {
	now := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	g := Grant{ID: "c1", Source: "node-a/vg/snap", Snapshot: true, TargetNode: "node-b", TargetName: "pvc-1", Expires: now.Add(time.Minute)}
	tests := []struct {
		name    string
		id      string
		peer    string
		advance time.Duration
		want    error
		// again is what a second read by the target then gets.
		again error
	}{
		{"the target node", "c1", "node-b", 0, nil, ErrUnknownCopy},
		{"another node", "c1", "node-c", 0, ErrWrongPeer, nil},
		{"an unknown copy", "c2", "node-b", 0, ErrUnknownCopy, nil},
		{"after expiry", "c1", "node-b", time.Minute, ErrExpired, ErrUnknownCopy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now = time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
			s := NewGrants(clock)
			if err := s.Add(g); err != nil {
				t.Fatal(err)
			}
			now = now.Add(tt.advance)
			got, err := s.Take(tt.id, tt.peer)
			if !errors.Is(err, tt.want) || tt.want != nil && err == nil {
				t.Fatalf("Take(%s, %s): %v, want %v", tt.id, tt.peer, err, tt.want)
			}
			if err == nil && got != g {
				t.Errorf("Take: %+v, want %+v", got, g)
			}
			if tt.advance == 0 && tt.want != nil && tt.again == nil {
				// The grant is kept for its target.
				if _, err := s.Take("c1", "node-b"); err != nil {
					t.Errorf("the target's read after a refused one: %v", err)
				}
				return
			}
			if _, err := s.Take("c1", "node-b"); !errors.Is(err, tt.again) {
				t.Errorf("a second read: %v, want %v", err, tt.again)
			}
		})
	}
}

// TestGrantsAdd: the same grant again is no error, another under its ID
// is, an incomplete one is, expired ones are dropped, and the set is
// bounded.
func TestGrantsAdd(t *testing.T) {
	now := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	s := NewGrants(func() time.Time { return now })
	g := Grant{ID: "c1", Source: "vg/v", TargetNode: "node-b", TargetName: "pvc-1", Expires: now.Add(time.Minute)}
	if err := s.Add(g); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(g); err != nil {
		t.Errorf("the same grant again: %v", err)
	}
	other := g
	other.TargetNode = "node-c"
	if err := s.Add(other); err == nil {
		t.Error("another grant under the same ID was taken")
	}
	if err := s.Add(Grant{ID: "c3", Source: "vg/v"}); err == nil {
		t.Error("a grant without a target was taken")
	}
	now = now.Add(2 * time.Minute)
	for i := range MaxGrants {
		g := g
		g.ID = "n" + string(rune('a'+i%26)) + time.Duration(i).String()
		g.Expires = now.Add(time.Minute)
		if err := s.Add(g); err != nil {
			t.Fatalf("grant %d: %v (the expired one should have been dropped)", i, err)
		}
	}
	g.ID = "one-too-many"
	g.Expires = now.Add(time.Minute)
	if err := s.Add(g); err == nil {
		t.Errorf("grant %d was taken", MaxGrants+1)
	}
	if n := s.Len(); n != MaxGrants {
		t.Errorf("Len %d, want %d", n, MaxGrants)
	}
}
