// Package pgcheck holds what the database tier checks a PostgreSQL by,
// apart from the database itself: the record of the transactions a client
// saw acknowledged, the comparison of that record with what a database
// holds, and pgbench's invariant (every TPC-B-like transaction adds the
// same delta to one account, one teller, one branch and one history row,
// so the four sums agree in any state the database may show).
package pgcheck

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Acks records the ids whose transactions a database acknowledged, in the
// order it did, with when. It is safe for concurrent use.
type Acks struct {
	mu  sync.Mutex
	ids []int64
	at  []time.Time
}

// Add records that the transaction writing id was acknowledged at at.
func (a *Acks) Add(id int64, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ids = append(a.ids, id)
	a.at = append(a.at, at)
}

// Len is the number of acknowledged ids.
func (a *Acks) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ids)
}

// All returns every acknowledged id.
func (a *Acks) All() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.ids)
}

// Before returns the ids acknowledged before t: the ones a snapshot taken
// at t or later must hold.
func (a *Acks) Before(t time.Time) []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []int64
	for i, at := range a.at {
		if at.Before(t) {
			out = append(out, a.ids[i])
		}
	}
	return out
}

// LongestGap returns the two consecutive acknowledgements furthest apart
// in time: for a client that writes without pause, the last one before
// the database's longest stop and the first one after it (zero times
// with fewer than two acknowledgements).
func (a *Acks) LongestGap() (last, first time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := 1; i < len(a.at); i++ {
		if a.at[i].Sub(a.at[i-1]) > first.Sub(last) {
			last, first = a.at[i-1], a.at[i]
		}
	}
	return last, first
}

// Missing returns, sorted, the acknowledged ids that present lacks.
func Missing(acked, present []int64) []int64 {
	have := make(map[int64]struct{}, len(present))
	for _, id := range present {
		have[id] = struct{}{}
	}
	var out []int64
	for _, id := range acked {
		if _, ok := have[id]; !ok {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ParseIDs reads one id a line (psql -At output of a one-column query).
func ParseIDs(out string) ([]int64, error) {
	var ids []int64
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		id, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("an id line %q: %w", line, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// BalancesQuery yields pgbench's four sums as one psql -At line,
// "accounts|tellers|branches|history".
const BalancesQuery = `select (select coalesce(sum(abalance), 0) from pgbench_accounts) || '|' ||
(select coalesce(sum(tbalance), 0) from pgbench_tellers) || '|' ||
(select coalesce(sum(bbalance), 0) from pgbench_branches) || '|' ||
(select coalesce(sum(delta), 0) from pgbench_history)`

// Balances are the sums of pgbench's balances and of its history's deltas.
type Balances struct {
	Accounts, Tellers, Branches, History int64
}

// ParseBalances reads BalancesQuery's line.
func ParseBalances(out string) (Balances, error) {
	f := strings.Split(strings.TrimSpace(out), "|")
	if len(f) != 4 {
		return Balances{}, fmt.Errorf("pgbench's sums %q: want four numbers separated by |", out)
	}
	var n [4]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Balances{}, fmt.Errorf("pgbench's sums %q: %w", out, err)
		}
		n[i] = v
	}
	return Balances{Accounts: n[0], Tellers: n[1], Branches: n[2], History: n[3]}, nil
}

// Check returns an error unless the four sums agree.
func (b Balances) Check() error {
	if b.Accounts == b.History && b.Tellers == b.History && b.Branches == b.History {
		return nil
	}
	return fmt.Errorf("pgbench's invariant is broken: sum(pgbench_accounts.abalance) %d, sum(pgbench_tellers.tbalance) %d, sum(pgbench_branches.bbalance) %d, sum(pgbench_history.delta) %d (all four must be equal)",
		b.Accounts, b.Tellers, b.Branches, b.History)
}

// ParseTPS reads the transactions per second of a pgbench run's summary
// (the "tps = N (without initial connection time)" line). A summary that
// counts a failed transaction, or has no such line, is an error: the
// figure of a run that failed measures nothing.
func ParseTPS(out string) (float64, error) {
	tps, found := 0.0, false
	for line := range strings.Lines(out) {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "number of failed transactions: "); ok && !strings.HasPrefix(rest, "0 ") {
			return 0, fmt.Errorf("pgbench: %s", line)
		}
		rest, ok := strings.CutPrefix(line, "tps = ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(rest + " ")[0], 64)
		if err != nil {
			return 0, fmt.Errorf("pgbench's line %q: %w", line, err)
		}
		tps, found = v, true
	}
	if !found {
		return 0, fmt.Errorf("pgbench printed no tps line: %q", out)
	}
	return tps, nil
}
