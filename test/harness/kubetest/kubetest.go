// Package kubetest holds what the tests of the end-to-end and real-node
// tiers share: contexts bounded by a duration, polling with a deadline, a
// namespace per test emptied of its volumes at the end, a claim with its
// pod, running a tier's tests on its test bed and tearing it down, the
// order of a tier's last tests, and the snapshot API's objects.
package kubetest

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// Ctx is a context bounded by d, cancelled when the test ends.
func Ctx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Poll calls cond every interval until it holds, and fails the test after
// timeout with what and cond's last status; onTimeout, when set, runs
// first (to report what else went wrong). An error from cond fails the
// test at once.
func Poll(t testing.TB, interval, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string, error), onTimeout func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		ok, status, err := cond(ctx)
		if err != nil && ctx.Err() == nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if status != "" {
			last = status
		}
		select {
		case <-ctx.Done():
			if onTimeout != nil {
				onTimeout()
			}
			t.Fatalf("%s did not happen within %s (last seen: %s)", what, timeout, last)
		case <-time.After(interval):
		}
	}
}

// Percentile is the p-th percentile (nearest rank) of ds, rounded to the
// millisecond; 0 for none.
func Percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	return s[max(i-1, 0)].Round(time.Millisecond)
}

// Rounds is how many rounds a measurement runs: CARVE_MEASURE_ROUNDS
// (the make targets' MEASURE_ROUNDS, PLACEMENT_ROUNDS), def when unset.
func Rounds(t testing.TB, def int) int {
	t.Helper()
	v := os.Getenv("CARVE_MEASURE_ROUNDS")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("CARVE_MEASURE_ROUNDS=%q: want a positive number", v)
	}
	return n
}
