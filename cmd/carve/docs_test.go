package main

import (
	"flag"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// documentedFlagRE finds the flags a table row of docs/configuration.md
// documents: those named in its first cell.
var documentedFlagRE = regexp.MustCompile("`--([a-z0-9-]+)`")

// documentedFlags are the flags the rows of section heading's table name
// in their first cell.
func documentedFlags(t *testing.T, doc, heading string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n"+heading)
	if !ok {
		t.Fatalf("docs/configuration.md has no section %q", heading)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	var names []string
	for _, line := range strings.Split(rest, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "| `--") || len(cells) < 3 {
			continue
		}
		for _, m := range documentedFlagRE.FindAllStringSubmatch(cells[1], -1) {
			names = append(names, m[1])
		}
	}
	return names
}

// TestConfigurationDocumentsEveryFlag: each flag a role registers has its
// row in docs/configuration.md, and each row names a flag the role has
// (a documented flag that does not exist, or one users cannot find, is
// how docs drift).
func TestConfigurationDocumentsEveryFlag(t *testing.T) {
	raw, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, role := range []string{"node", "controller"} {
		r := roles(io.Discard)[role]
		if r.absent != "" {
			// Not in this build (carve-node has no controller); the
			// build that has it checks it.
			continue
		}
		t.Run(role, func(t *testing.T) {
			fs := flag.NewFlagSet(role, flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			r.flags(fs)
			var registered []string
			fs.VisitAll(func(f *flag.Flag) { registered = append(registered, f.Name) })
			documented := documentedFlags(t, doc, "## `carve "+role+"`")
			// run adds these to every role: component-base's logging
			// flags (one row documents them) and --version.
			common := []string{"logging-format", "version"}
			for _, name := range registered {
				if !slices.Contains(documented, name) {
					t.Errorf("carve %s --%s has no row in docs/configuration.md", role, name)
				}
			}
			for _, name := range documented {
				if !slices.Contains(registered, name) && !slices.Contains(common, name) {
					t.Errorf("docs/configuration.md documents carve %s --%s, which the role does not have", role, name)
				}
			}
		})
	}
}
