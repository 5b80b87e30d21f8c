package kubetest

import (
	"flag"
	"slices"
	"strconv"
	"sync"
	"testing"
)

// Finale is the tests a tier runs after every other one, in a set order,
// whatever the files they sit in are called. Each of them calls Enter
// first; a tier with a Finale has no other parallel test.
type Finale struct {
	names []string
	mu    sync.Mutex
	// done holds, per test of the finale that was started, a channel
	// closed when it has ended.
	done map[string]chan struct{}
}

// NewFinale orders the tests named, the last one last.
func NewFinale(names ...string) *Finale {
	return &Finale{names: names, done: map[string]chan struct{}{}}
}

// Enter holds t until every other test of the tier has ended and then
// until the finale's tests named before it that run have ended. It makes
// t parallel: the test runner starts parallel tests only once every serial
// one has ended. t must be named in the finale.
func (f *Finale) Enter(t *testing.T) {
	t.Helper()
	i := slices.Index(f.names, t.Name())
	if i < 0 {
		t.Fatalf("%s is not in the finale %v", t.Name(), f.names)
	}
	done := make(chan struct{})
	f.mu.Lock()
	f.done[t.Name()] = done
	f.mu.Unlock()
	t.Cleanup(func() { close(done) })
	t.Parallel()
	// Every test that runs has entered by now: the serial part of each
	// test, up to its Parallel call, ran before any parallel test went on.
	f.mu.Lock()
	var before []chan struct{}
	for _, name := range f.names[:i] {
		if ch, ok := f.done[name]; ok {
			before = append(before, ch)
		}
	}
	f.mu.Unlock()
	for _, ch := range before {
		<-ch
	}
}

// makeRoom raises -test.parallel to the finale's length when it is lower:
// a test of the finale holds its parallel slot while it waits for those
// before it, so with fewer slots the first could never start.
func (f *Finale) makeRoom() error {
	fl := flag.Lookup("test.parallel")
	if fl == nil {
		return nil
	}
	n, err := strconv.Atoi(fl.Value.String())
	if err != nil || n >= len(f.names) {
		return err
	}
	return fl.Value.Set(strconv.Itoa(len(f.names)))
}
