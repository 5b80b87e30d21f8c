//go:build e2e

package e2e

import (
	"errors"
	"os/exec"
	"testing"
)

// output runs cmd and returns its stdout; a failure fails t with what
// (the command as the user types it, say "kubectl get pods") and the
// command's stderr.
func output(t *testing.T, cmd *exec.Cmd, what string) string {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			stderr = string(exitErr.Stderr)
		}
		t.Fatalf("%s: %v: %s", what, err, stderr)
	}
	return string(out)
}
