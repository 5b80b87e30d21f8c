//go:build guestinner

package lvminner

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
)

// countingObserver counts the lvm commands the package runs, so the
// benchmark shows round trips as well as time.
type countingObserver struct{ n atomic.Int64 }

func (o *countingObserver) ObserveCommand(string, time.Duration, error) { o.n.Add(1) }

// BenchmarkCreateRemove compares a thick CreateLV + RemoveLV through the
// package with the same raw lvcreate + lvremove on the same VG, interleaved
// iteration by iteration (alternating which goes first) so that both see
// the same machine. Reported: the medians pkg-ns/op and raw-ns/op, their
// ratio pkg/raw, and the lvm commands the package ran per create+remove.
func BenchmarkCreateRemove(b *testing.B) {
	ctx := context.Background()
	vg := newVG(b, gib)
	obs := &countingObserver{}
	c := lvm.New(lvm.Options{Observer: obs, Env: vg.Env()})
	const size = 16 * mib
	tags := []string{"carve.dev/bench"}
	pkg := func(name string) {
		if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: vg.Name, Name: name, Size: size, Tags: tags}); err != nil {
			b.Fatal(err)
		}
		if err := c.RemoveLV(ctx, vg.Name, name); err != nil {
			b.Fatal(err)
		}
	}
	// The same command lines the package builds.
	raw := func(name string) {
		lvmRaw(b, vg, "lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y", "--name", name,
			"--size", fmt.Sprintf("%db", size), "--addtag", tags[0], vg.Name)
		lvmRaw(b, vg, "lvremove", "--yes", vg.Name+"/"+name)
	}
	// Warm up both (the package reads the VG's extent size once).
	pkg("warm-pkg")
	raw("warm-raw")
	obs.n.Store(0)

	var pkgTimes, rawTimes []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		timed := func(f func(string), name string, into *[]time.Duration) {
			start := time.Now()
			f(name)
			*into = append(*into, time.Since(start))
		}
		if i%2 == 0 {
			timed(pkg, fmt.Sprintf("p%d", i), &pkgTimes)
			timed(raw, fmt.Sprintf("r%d", i), &rawTimes)
		} else {
			timed(raw, fmt.Sprintf("r%d", i), &rawTimes)
			timed(pkg, fmt.Sprintf("p%d", i), &pkgTimes)
		}
	}
	b.StopTimer()
	report(b, pkgTimes, rawTimes)
	b.ReportMetric(float64(obs.n.Load())/float64(b.N), "pkg-cmds/op")
}

// BenchmarkReport compares one Report() (the package's whole-state read)
// with one raw `lvs --reportformat json` on a VG holding a thin pool and
// some thick and thin LVs, interleaved the same way.
func BenchmarkReport(b *testing.B) {
	ctx := context.Background()
	vg := newVG(b, gib)
	newThinPool(b, vg, "pool", 128*mib)
	c := lvm.New(lvm.Options{Env: vg.Env()})
	for i := 0; i < 4; i++ {
		if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: vg.Name, Name: fmt.Sprintf("thick%d", i), Size: 8 * mib}); err != nil {
			b.Fatal(err)
		}
		if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: vg.Name, Name: fmt.Sprintf("thin%d", i), Size: 64 * mib, ThinPool: "pool"}); err != nil {
			b.Fatal(err)
		}
	}
	pkg := func() {
		r, err := c.Report(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if r.FindThinPool(vg.Name, "pool") == nil {
			b.Fatal("Report lost the thin pool")
		}
	}
	raw := func() {
		lvmRaw(b, vg, "lvs", "--all", "--reportformat", "json", "--units", "b", "--nosuffix")
	}
	pkg()
	raw()
	var pkgTimes, rawTimes []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		first, second := pkg, raw
		t1, t2 := &pkgTimes, &rawTimes
		if i%2 == 1 {
			first, second, t1, t2 = raw, pkg, &rawTimes, &pkgTimes
		}
		start := time.Now()
		first()
		mid := time.Now()
		second()
		*t1 = append(*t1, mid.Sub(start))
		*t2 = append(*t2, time.Since(mid))
	}
	b.StopTimer()
	report(b, pkgTimes, rawTimes)
}

// report gives the medians of both sides and their ratio: under TCG on a
// shared machine a few runs take several times longer than the rest, and
// the median keeps such outliers from deciding the ratio.
func report(b *testing.B, pkgTimes, rawTimes []time.Duration) {
	p, r := median(pkgTimes), median(rawTimes)
	b.ReportMetric(float64(p.Nanoseconds()), "pkg-ns/op")
	b.ReportMetric(float64(r.Nanoseconds()), "raw-ns/op")
	b.ReportMetric(float64(p)/float64(r), "pkg/raw")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
