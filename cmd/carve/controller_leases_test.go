//go:build !nodeagent

package main

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"
)

// TestLeasesAreDocumented: users grant, watch and delete these Leases by
// name, so --leader-election's help and its row in docs/configuration.md
// name each duty's Lease.
func TestLeasesAreDocumented(t *testing.T) {
	raw, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "| `--leader-election` |") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("docs/configuration.md has no row for --leader-election")
	}
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o ControllerOptions
	o.AddFlags(fs)
	help := fs.Lookup("leader-election").Usage
	for _, lease := range []string{leaseName, capacityLease} {
		if !strings.Contains(row, "`"+lease+"`") {
			t.Errorf("docs/configuration.md's --leader-election row does not name the Lease %s", lease)
		}
		if !strings.Contains(help, " "+lease+" ") {
			t.Errorf("--leader-election's help does not name the Lease %s: %q", lease, help)
		}
	}
}
