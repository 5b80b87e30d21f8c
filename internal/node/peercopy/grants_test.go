package peercopy

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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

// TestGrantsExpire: a grant left unread lapses at its expiry and is
// counted once, whether a read finds it expired or nothing asks for it;
// a grant read in time is not counted.
func TestGrantsExpire(t *testing.T) {
	now := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	s := NewGrants(func() time.Time { return now })
	for i, valid := range []time.Duration{time.Minute, time.Minute, 5 * time.Minute} {
		g := Grant{ID: "c" + string(rune('0'+i)), Source: "vg/v", TargetNode: "node-b", TargetName: "pvc-1", Expires: now.Add(valid)}
		if err := s.Add(g); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Take("c2", "node-b"); err != nil {
		t.Fatal(err)
	}
	if n := s.Expired(); n != 0 {
		t.Fatalf("Expired before any expiry: %d", n)
	}
	now = now.Add(time.Minute)
	if _, err := s.Take("c0", "node-b"); !errors.Is(err, ErrExpired) {
		t.Fatalf("Take after expiry: %v, want %v", err, ErrExpired)
	}
	if n, left := s.Expired(), s.Len(); n != 2 || left != 0 {
		t.Errorf("Expired %d, Len %d; want 2 (c0 read late, c1 never read) and none left", n, left)
	}
	now = now.Add(time.Hour)
	if n := s.Expired(); n != 2 {
		t.Errorf("Expired %d later, want each grant counted once: 2", n)
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

// TestExpiredGrantsMetric: carve_copy_grants_expired_total counts the
// grants of a Server that lapsed unread, by the time of the scrape.
func TestExpiredGrantsMetric(t *testing.T) {
	now := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	s := NewServer(ServerConfig{NodeName: "node-a", Now: func() time.Time { return now }})
	reg := prometheus.NewPedanticRegistry()
	if err := s.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if err := s.grants.Add(Grant{ID: "c1", Source: "vg/v", TargetNode: "node-b", TargetName: "pvc-1", Expires: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	want := func(n int) string {
		return "# HELP carve_copy_grants_expired_total Copy grants of this node (a restore, clone or catch-up on another node reading one of this node's sources) that lapsed unread: the copy failed before its read, or the controller gave it up.\n" +
			"# TYPE carve_copy_grants_expired_total counter\ncarve_copy_grants_expired_total " + strconv.Itoa(n) + "\n"
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(0))); err != nil {
		t.Error(err)
	}
	now = now.Add(time.Minute)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(1))); err != nil {
		t.Errorf("after the grant's expiry: %v", err)
	}
}
