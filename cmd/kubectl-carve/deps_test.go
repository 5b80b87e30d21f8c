package main

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestPluginLinksNoMover: the plugin asks for moves and follows them
// through api/moveapi's names only; internal/controller/mover would bring the controller's
// informers and CSI types into every user's kubectl (0.7 MB).
func TestPluginLinksNoMover(t *testing.T) {
	cmd := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{.ImportPath}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	// The check sees what it should.
	if !slices.Contains(deps, "github.com/carve-csi/carve/api/moveapi") {
		t.Fatalf("go list -deps does not list api/moveapi: the check is broken\n%s", out)
	}
	if slices.Contains(deps, "github.com/carve-csi/carve/internal/controller/mover") {
		t.Error("kubectl-carve links internal/controller/mover; take the move's names from api/moveapi")
	}
}
