package volumelock

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestSameKeyIsExclusive(t *testing.T) {
	l := New()
	if !l.TryAcquire("a") {
		t.Fatal("first TryAcquire(a) failed")
	}
	if l.TryAcquire("a") {
		t.Fatal("second TryAcquire(a) succeeded while a is held")
	}
	l.Release("a")
	if !l.TryAcquire("a") {
		t.Fatal("TryAcquire(a) after Release failed")
	}
	l.Release("a")
	if l.Held() != 0 {
		t.Fatalf("Held = %d after releasing everything", l.Held())
	}
}

func TestDifferentKeysAreIndependent(t *testing.T) {
	l := New()
	for _, k := range []string{"a", "b", "c"} {
		if !l.TryAcquire(k) {
			t.Fatalf("TryAcquire(%s) failed while only other keys are held", k)
		}
	}
	if l.Held() != 3 {
		t.Fatalf("Held = %d, want 3", l.Held())
	}
	l.Release("b")
	if l.TryAcquire("a") || !l.TryAcquire("b") {
		t.Fatal("Release(b) affected another key")
	}
}

func TestReleaseUnheldIsHarmless(t *testing.T) {
	l := New()
	l.Release("never")
	if !l.TryAcquire("never") {
		t.Fatal("TryAcquire after a stray Release failed")
	}
}

// TestConcurrentSameKey: of many goroutines racing for one key, exactly one
// wins each round; the others see it busy.
func TestConcurrentSameKey(t *testing.T) {
	l := New()
	for round := range 20 {
		var wins, losses atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if l.TryAcquire("vol") {
					wins.Add(1)
				} else {
					losses.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 || losses.Load() != 15 {
			t.Fatalf("round %d: %d wins, %d losses; want 1 and 15", round, wins.Load(), losses.Load())
		}
		l.Release("vol")
	}
}

func TestConcurrentDifferentKeys(t *testing.T) {
	l := New()
	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !l.TryAcquire(fmt.Sprint("vol-", i)) {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 || l.Held() != 32 {
		t.Fatalf("%d of 32 distinct keys were refused; held %d", failed.Load(), l.Held())
	}
}

// TestKeys: the held keys, sorted; a released key is not among them.
func TestKeys(t *testing.T) {
	l := New()
	if got := l.Keys(); len(got) != 0 {
		t.Fatalf("Keys of an empty set: %v", got)
	}
	for _, k := range []string{"c", "a", "b"} {
		l.TryAcquire(k)
	}
	l.Release("b")
	if got := l.Keys(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("Keys %v, want [a c]", got)
	}
}
