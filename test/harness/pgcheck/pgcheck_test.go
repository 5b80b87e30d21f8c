package pgcheck

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMissingFindsALostAcknowledgedID(t *testing.T) {
	acked := []int64{1, 2, 3, 4, 5}
	if got := Missing(acked, []int64{5, 4, 3, 2, 1, 6}); len(got) != 0 {
		t.Errorf("every acked id present (and one unacknowledged extra): Missing = %v, want none", got)
	}
	if got := Missing(acked, []int64{1, 2, 4}); !slices.Equal(got, []int64{3, 5}) {
		t.Errorf("ids 3 and 5 lost: Missing = %v, want [3 5]", got)
	}
	if got := Missing(acked, nil); !slices.Equal(got, acked) {
		t.Errorf("an empty table: Missing = %v, want every acked id", got)
	}
}

func TestAcksBeforeCutsAtTheSnapshot(t *testing.T) {
	var a Acks
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for i := range 10 {
		a.Add(int64(i+1), t0.Add(time.Duration(i)*time.Second))
	}
	got := a.Before(t0.Add(4500 * time.Millisecond))
	if !slices.Equal(got, []int64{1, 2, 3, 4, 5}) {
		t.Errorf("Before(4.5 s) = %v, want the five ids acknowledged in the first 4.5 s", got)
	}
	if a.Len() != 10 || len(a.All()) != 10 {
		t.Errorf("Len %d, All %d ids, want 10", a.Len(), len(a.All()))
	}
}

func TestAcksLongestGapIsTheStop(t *testing.T) {
	var a Acks
	if last, first := a.LongestGap(); !last.IsZero() || !first.IsZero() {
		t.Errorf("no acknowledgement: LongestGap = %v, %v, want zero times", last, first)
	}
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	at := []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 40 * time.Second, 41 * time.Second, 50 * time.Second}
	for i, d := range at {
		a.Add(int64(i+1), t0.Add(d))
	}
	last, first := a.LongestGap()
	if !last.Equal(t0.Add(3*time.Second)) || !first.Equal(t0.Add(40*time.Second)) {
		t.Errorf("LongestGap = %s, %s after t0, want 3s, 40s (the 37 s stop, not the 9 s pause after it)", last.Sub(t0), first.Sub(t0))
	}
}

func TestAcksIsSafeForConcurrentUse(t *testing.T) {
	var a Acks
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				a.Add(int64(w*1000+i), time.Now())
			}
		})
	}
	wg.Wait()
	if a.Len() != 400 {
		t.Errorf("Len = %d after 4 writers added 100 each, want 400", a.Len())
	}
}

func TestParseIDs(t *testing.T) {
	got, err := ParseIDs("1\n2\n\n30\n")
	if err != nil || !slices.Equal(got, []int64{1, 2, 30}) {
		t.Errorf("ParseIDs = %v, %v; want [1 2 30]", got, err)
	}
	if _, err := ParseIDs("1\nERROR: relation \"acks\" does not exist\n"); err == nil {
		t.Error("ParseIDs took an error message for ids")
	}
}

func TestBalancesCheck(t *testing.T) {
	b, err := ParseBalances("-4521|-4521|-4521|-4521\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Check(); err != nil {
		t.Errorf("equal sums: %v", err)
	}
	for _, line := range []string{
		"-4521|-4521|-4521|-4000", // a history row lost
		"-4000|-4521|-4521|-4521", // an account's update lost
		"-4521|-4521|0|-4521",     // a branch's update lost
	} {
		b, err := ParseBalances(line)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Check(); err == nil || !strings.Contains(err.Error(), "invariant is broken") {
			t.Errorf("sums %s: Check = %v, want the invariant broken", line, err)
		}
	}
	for _, bad := range []string{"", "1|2|3", "1|2|3|x", "psql: error: connection refused"} {
		if _, err := ParseBalances(bad); err == nil {
			t.Errorf("ParseBalances(%q) took it for four sums", bad)
		}
	}
}

func TestParseTPS(t *testing.T) {
	// pgbench 15's summary of a 40 s run with two clients.
	const summary = `transaction type: <builtin: TPC-B (sort of)>
scaling factor: 1
query mode: simple
number of clients: 2
number of threads: 2
maximum number of tries: 1
duration: 40 s
number of transactions actually processed: 1497
number of failed transactions: 0 (0.000%)
latency average = 53.438 ms
initial connection time = 18.722 ms
tps = 37.426604 (without initial connection time)
`
	tps, err := ParseTPS(summary)
	if err != nil || tps != 37.426604 {
		t.Errorf("ParseTPS = %v, %v; want 37.426604", tps, err)
	}
	failed := strings.Replace(summary, "failed transactions: 0 (0.000%)", "failed transactions: 3 (0.200%)", 1)
	if _, err := ParseTPS(failed); err == nil {
		t.Error("ParseTPS took a run with failed transactions")
	}
	if _, err := ParseTPS("pgbench: error: connection to server on socket \"/tmp/.s.PGSQL.5432\" failed\n"); err == nil {
		t.Error("ParseTPS took output without a tps line")
	}
}
