//go:build guesttest

package guest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchLine matches a benchmark result line: name, iterations and the
// value/unit pairs after them.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

// parseBench returns, per benchmark, its metrics by unit.
func parseBench(out string) map[string]map[string]float64 {
	res := map[string]map[string]float64{}
	for _, line := range strings.Split(out, "\n") {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		metrics := map[string]float64{}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				metrics[f[i+1]] = v
			}
		}
		res[m[1]] = metrics
	}
	return res
}

// TestBenchLVM (make bench) runs the lvm package's benchmarks in the guest
// and prints each as a ratio against the raw lvm commands of the same run.
// It fails only when a benchmark did not run; the figures are reported, not
// asserted.
func TestBenchLVM(t *testing.T) {
	out := runInGuest(t, guestRun{
		pkg:     "github.com/carve-csi/carve/test/guest/inner/lvminner",
		args:    []string{"-test.run", "^$", "-test.bench", ".", "-test.benchtime", "20x"},
		timeout: 15 * time.Minute,
	})
	got := parseBench(out)
	for _, b := range []struct{ name, label string }{
		{"BenchmarkCreateRemove", "create+remove (thick)"},
		{"BenchmarkReport", "state refresh: Report() vs lvs --reportformat json"},
	} {
		m, ok := got[b.name]
		if !ok || m["pkg/raw"] == 0 {
			t.Errorf("%s did not report a pkg/raw ratio; output:\n%s", b.name, out)
			continue
		}
		line := fmt.Sprintf("ratio %s package/raw: %.2f (medians: package %s, raw %s per op",
			b.label, m["pkg/raw"], time.Duration(m["pkg-ns/op"]).Round(time.Millisecond), time.Duration(m["raw-ns/op"]).Round(time.Millisecond))
		if c, ok := m["pkg-cmds/op"]; ok {
			line += fmt.Sprintf(", %.1f lvm commands per create+remove", c)
		}
		fmt.Println(line + ")")
	}
}
