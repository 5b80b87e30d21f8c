package lvm

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond; the tests below wait for goroutines to reach a state
// instead of sleeping for a guessed time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestVGLocksSameVGSerialize(t *testing.T) {
	var l VGLocks
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := l.Lock(context.Background(), "vg0")
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(time.Millisecond)
			inside.Add(-1)
			unlock()
		}()
	}
	wg.Wait()
	if most.Load() != 1 {
		t.Errorf("%d holders of one VG's lock at once, want 1", most.Load())
	}
	if l.Size() != 0 {
		t.Errorf("%d lock entries left after all were released", l.Size())
	}
}

func TestVGLocksDifferentVGsConcurrent(t *testing.T) {
	var l VGLocks
	unlockA, err := l.Lock(context.Background(), "vgA")
	if err != nil {
		t.Fatal(err)
	}
	// vgB is free while vgA is held: this must not block.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlockB, err := l.Lock(ctx, "vgB")
	if err != nil {
		t.Fatalf("lock of vgB while vgA is held: %v", err)
	}
	unlockB()
	unlockA()
}

func TestVGLocksWaitHonoursContext(t *testing.T) {
	var l VGLocks
	unlock, err := l.Lock(context.Background(), "vg0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := l.Lock(ctx, "vg0")
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("waiter got %v, want context.Canceled", err)
	}
	unlock()
	if l.Size() != 0 {
		t.Errorf("%d entries left, want 0", l.Size())
	}
	// The lock is free again.
	unlock, err = l.Lock(context.Background(), "vg0")
	if err != nil {
		t.Fatal(err)
	}
	unlock()
}

// blockingRunner holds every lvcreate until released, counting how many run
// at once per VG; reads answer at once.
type blockingRunner struct {
	fake    *fakeLVM
	release chan struct{}
	mu      sync.Mutex
	running map[string]int
	most    map[string]int
	started atomic.Int32
}

func (b *blockingRunner) run(ctx context.Context, args []string) (output, error) {
	if args[0] != "lvcreate" {
		return b.fake.run(ctx, args)
	}
	vg := args[len(args)-1]
	b.mu.Lock()
	b.running[vg]++
	if b.running[vg] > b.most[vg] {
		b.most[vg] = b.running[vg]
	}
	b.mu.Unlock()
	b.started.Add(1)
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	b.mu.Lock()
	b.running[vg]--
	b.mu.Unlock()
	return output{}, ctx.Err()
}

// TestClientSerializesMutationsPerVG runs creates in two VGs through a
// Client: those of one VG run one at a time, the two VGs at once, and a
// Report is answered while creates are stuck.
func TestClientSerializesMutationsPerVG(t *testing.T) {
	f := loadFake(t, "fullreport-thick.json")
	b := &blockingRunner{fake: f, release: make(chan struct{}), running: map[string]int{}, most: map[string]int{}}
	c := newClient(Options{}, b, nil)
	c.remember([]VolumeGroup{{Name: "rec-thick", ExtentSize: 4 << 20}, {Name: "rec-empty", ExtentSize: 4 << 20}})

	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		for _, vg := range []string{"rec-thick", "rec-empty"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := CreateRequest{VolumeGroup: vg, Name: "lv" + string(rune('a'+i)), Size: 1}
				if _, err := c.CreateLV(ctx, req); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	// Both VGs have a create in lvcreate at the same time.
	waitFor(t, "one lvcreate per VG", func() bool { return b.started.Load() == 2 })
	b.mu.Lock()
	both := b.running["rec-thick"] == 1 && b.running["rec-empty"] == 1
	b.mu.Unlock()
	if !both {
		t.Errorf("running %v, want one lvcreate in each VG", b.running)
	}
	// Reads do not wait for the stuck mutations.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if _, err := c.Report(rctx); err != nil {
		t.Errorf("Report while mutations are stuck: %v", err)
	}
	cancel()
	for i := 0; i < 16; i++ {
		b.release <- struct{}{}
	}
	wg.Wait()
	if b.most["rec-thick"] != 1 || b.most["rec-empty"] != 1 {
		t.Errorf("most concurrent lvcreates per VG %v, want 1 each", b.most)
	}
	if c.locks.Size() != 0 {
		t.Errorf("%d lock entries left", c.locks.Size())
	}
}

// TestSettleWaitsForTheVGLock: Settle returns once no mutation of the VG
// holds its lock (one whose caller gave up keeps it until it exits).
func TestSettleWaitsForTheVGLock(t *testing.T) {
	c := helperClient(Options{})
	unlock, err := c.locks.Lock(context.Background(), "vg")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Settle(short, "vg"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Settle while a mutation holds the lock = %v, want DeadlineExceeded", err)
	}
	if err := c.Settle(context.Background(), "other"); err != nil {
		t.Fatalf("Settle of another VG = %v", err)
	}
	unlock()
	if err := c.Settle(context.Background(), "vg"); err != nil {
		t.Fatalf("Settle once the lock is free = %v", err)
	}
}
