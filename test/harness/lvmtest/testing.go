package lvmtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"
)

// Require fails the test, saying what is missing, when this machine cannot
// make loop volume groups. Root tiers never skip.
func Require(t testing.TB) {
	t.Helper()
	if err := Check(); err != nil {
		t.Fatal(err)
	}
}

// UniqueName returns prefix followed by random hex digits: VG names are
// global on a machine where other tests run at the same time.
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return prefix + hex.EncodeToString(b)
}

// New makes a volume group for a test and removes it when the test ends,
// whether it passed or not. opts.Dir defaults to t.TempDir() and opts.Name
// to a unique "carvetest" name. It fails the test when anything is missing.
func New(t testing.TB, opts Options) *LoopVG {
	t.Helper()
	Require(t)
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.Name == "" {
		opts.Name = UniqueName("carvetest")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := Create(ctx, opts)
	if err != nil {
		t.Fatalf("making loop volume group %s: %v", opts.Name, err)
	}
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("removing loop volume group %s: %v", v.Name, err)
		}
	})
	return v
}
