package main

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// nodeAgentTags are the build tags of carve-node, as make build and the
// Dockerfile give them.
const nodeAgentTags = "nodeagent,grpcnotrace"

// TestNodeAgentLinksNoKubernetesClient: carve-node (this package built
// with -tags nodeagent,grpcnotrace), the binary every node runs, links no
// Kubernetes client, no Kubernetes API types and no request tracing. Their
// code, mapped into every node agent, is most of its resident memory
// (docs/benchmarks.md). A file that imports client-go or k8s.io/api, or
// a package that reaches them, must be built only without the tag
// (//go:build !nodeagent); the failure names the importer.
func TestNodeAgentLinksNoKubernetesClient(t *testing.T) {
	// As make build builds it. go test puts its own go first in PATH.
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-tags", nodeAgentTags,
		"-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps -tags %s: %v\n%s", nodeAgentTags, err, stderr)
	}
	var deps, offending []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		deps = append(deps, pkg)
		if unwantedOnNodes(pkg) {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if unwantedOnNodes(imp) {
				offending = append(offending, pkg+" imports "+imp)
			}
		}
	}
	// The check sees what it should: the node agent's own packages.
	for _, want := range []string{"github.com/carve-csi/carve/cmd/carve", "github.com/carve-csi/carve/internal/node/driver", "github.com/carve-csi/carve/internal/node/channel"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps -tags %s does not list %s: the check is broken", nodeAgentTags, want)
		}
	}
	if len(offending) > 0 {
		t.Errorf("carve-node (-tags %s) links what the node agent must not; give the file that brings it in //go:build !nodeagent:\n%s",
			nodeAgentTags, strings.Join(offending, "\n"))
	}
}

// unwantedOnNodes tells a package the node agent must not link: client-go
// (the node has no API rights), the API types (internal/topology/pinned keeps the
// one it needs apart) and gRPC's request tracing (golang.org/x/net/trace
// and html/template; off with the grpcnotrace tag).
func unwantedOnNodes(pkg string) bool {
	for _, root := range []string{"k8s.io/client-go", "k8s.io/api", "golang.org/x/net/trace"} {
		if pkg == root || strings.HasPrefix(pkg, root+"/") {
			return true
		}
	}
	return false
}
