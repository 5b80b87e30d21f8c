package loop

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestNext: an item synced without a result is forgotten; one that fails
// or asks Again comes back with backoff, its attempts counted; one that
// asks After comes back after that long, its attempts counted from zero.
func TestNext(t *testing.T) {
	q := NewQueue[string](time.Millisecond, 10*time.Millisecond)
	defer q.ShutDown()
	ctx := context.Background()
	var attempts []int
	results := []struct {
		res Result
		err error
	}{
		{err: errors.New("boom")},
		{res: Result{Again: true}},
		{res: Result{After: 5 * time.Millisecond}},
		{},
	}
	q.Add("a")
	for i, r := range results {
		done := make(chan bool, 1)
		go func() {
			done <- Next(ctx, q, func(_ context.Context, item string, attempt int) (Result, error) {
				if item != "a" {
					t.Errorf("item %q", item)
				}
				attempts = append(attempts, attempt)
				return r.res, r.err
			})
		}()
		select {
		case ok := <-done:
			if !ok {
				t.Fatalf("sync %d: Next ended", i)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("sync %d: the item did not come back", i)
		}
	}
	if want := []int{0, 1, 2, 0}; !slices.Equal(attempts, want) {
		t.Errorf("attempts %v, want %v", attempts, want)
	}
	if n := q.Len(); n != 0 {
		t.Errorf("%d items queued after a sync that asked nothing more", n)
	}
}

// TestWorkers: stop waits for the workers; an item is never synced by
// two at once.
func TestWorkers(t *testing.T) {
	q := NewQueue[int](time.Millisecond, time.Millisecond)
	var mu sync.Mutex
	running := map[int]bool{}
	synced := 0
	stop := Workers(context.Background(), q, 4, func(_ context.Context, item, _ int) (Result, error) {
		mu.Lock()
		if running[item] {
			t.Errorf("item %d synced twice at once", item)
		}
		running[item] = true
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		delete(running, item)
		synced++
		mu.Unlock()
		return Result{}, nil
	})
	for i := range 100 {
		q.Add(i % 10)
	}
	for q.Len() > 0 {
		time.Sleep(time.Millisecond)
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(running) != 0 || synced == 0 {
		t.Errorf("after stop: %d running, %d synced", len(running), synced)
	}
}
