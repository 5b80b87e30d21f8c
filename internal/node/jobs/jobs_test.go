package jobs

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// A job outlives the context of the call that started it, a second Start
// for the key joins it, and what happens after it ended depends on Keep.
func TestJobOutlivesItsCaller(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(map[bool]string{false: "forgotten at the end", true: "kept until taken"}[keep], func(t *testing.T) {
			s := &Set[int]{Keep: keep}
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "caller"))
			release := make(chan struct{})
			runs := 0
			run := func(jobCtx context.Context) (int, error) {
				runs++
				<-release
				if jobCtx.Err() != nil || jobCtx.Value(ctxKey{}) != "caller" {
					return 0, errors.New("the job's context was cancelled or lost the caller's values")
				}
				return 42, nil
			}
			j, started := s.Start(ctx, "vol", "args", run)
			if !started {
				t.Fatal("first Start did not start")
			}
			cancel()
			if j.Wait(ctx) {
				t.Fatal("Wait under an ended context reported the job done")
			}
			if j2, started := s.Start(context.Background(), "vol", "args", run); started || j2 != j {
				t.Fatal("a second Start did not join the job in flight")
			}
			if !s.Running("vol") {
				t.Error("Running is false while the job runs")
			}
			close(release)
			if v, err := j.Result(); v != 42 || err != nil {
				t.Fatalf("Result = %d, %v", v, err)
			}
			waitFor(t, func() bool { return !s.Running("vol") })
			if _, ok := s.Get("vol"); ok != keep {
				t.Errorf("after the end Get finds the job: %t, want %t", ok, keep)
			}
			s.Take("vol", j)
			if _, ok := s.Get("vol"); ok {
				t.Error("Take left the ended job")
			}
			if runs != 1 {
				t.Errorf("the work ran %d times, want 1", runs)
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met in 5s")
		}
	}
}

// AnswerBy leaves the caller time to answer before its deadline.
func TestAnswerBy(t *testing.T) {
	cases := []struct {
		name            string
		left, maxMargin time.Duration
		// want is the rule the margin follows; margin computes it from
		// the time left.
		want   string
		margin func(left time.Duration) time.Duration
	}{
		{"long deadline: the margin is capped", 2 * time.Minute, 5 * time.Second,
			"the cap", func(time.Duration) time.Duration { return 5 * time.Second }},
		{"short deadline: half of what is left", 200 * time.Millisecond, 5 * time.Second,
			"half of what is left", func(left time.Duration) time.Duration { return left / 2 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.left)
			defer cancel()
			parent, _ := ctx.Deadline()
			// What is left when AnswerBy reads it lies between these two,
			// however long the machine stalls the test in between.
			leftBefore := time.Until(parent)
			wctx, wcancel := AnswerBy(ctx, tc.maxMargin)
			defer wcancel()
			leftAfter := time.Until(parent)
			got, ok := wctx.Deadline()
			if !ok {
				t.Fatal("no deadline")
			}
			lo, hi := tc.margin(leftAfter), tc.margin(leftBefore)
			if margin := parent.Sub(got); margin < lo || margin > hi {
				t.Errorf("margin %s, want %s to %s (%s)", margin, lo, hi, tc.want)
			}
		})
	}
	wctx, cancel := AnswerBy(context.Background(), time.Second)
	defer cancel()
	if _, ok := wctx.Deadline(); ok {
		t.Error("a context without a deadline got one")
	}
}
