package main

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNodeAgentLinksNoKubernetesClient: carve-node (this package built
// with -tags nodeagent), the binary every node runs, links no Kubernetes
// client. client-go's code, mapped into every node agent, would double its
// resident memory (docs/benchmarks.md). A file that imports client-go, or
// a package that reaches it, must be built only without the tag
// (//go:build !nodeagent); the failure names the importer.
func TestNodeAgentLinksNoKubernetesClient(t *testing.T) {
	// As make build builds it. go test puts its own go first in PATH.
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-tags", "nodeagent",
		"-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps -tags nodeagent: %v\n%s", err, stderr)
	}
	var deps, offending []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		deps = append(deps, pkg)
		if isKubernetesClient(pkg) {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if isKubernetesClient(imp) {
				offending = append(offending, pkg+" imports "+imp)
			}
		}
	}
	// The check sees what it should: the node agent's own packages.
	for _, want := range []string{"github.com/carve-csi/carve/cmd/carve", "github.com/carve-csi/carve/pkg/driver", "github.com/carve-csi/carve/pkg/nodeagent"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps -tags nodeagent does not list %s: the check is broken", want)
		}
	}
	if len(offending) > 0 {
		t.Errorf("carve-node (-tags nodeagent) links a Kubernetes client; give the file that brings it in //go:build !nodeagent:\n%s",
			strings.Join(offending, "\n"))
	}
}

// isKubernetesClient tells a package of client-go, the Kubernetes client.
func isKubernetesClient(pkg string) bool {
	return pkg == "k8s.io/client-go" || strings.HasPrefix(pkg, "k8s.io/client-go/")
}
