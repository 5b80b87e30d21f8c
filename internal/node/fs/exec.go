package fs

import (
	"context"

	utilexec "k8s.io/utils/exec"
)

// contextExec binds mount-utils' commands to the request's context.
type contextExec struct {
	ctx  context.Context
	exec utilexec.Interface
}

var _ utilexec.Interface = (*contextExec)(nil)

func (e *contextExec) Command(cmd string, args ...string) utilexec.Cmd {
	return e.exec.CommandContext(e.ctx, cmd, args...)
}

func (e *contextExec) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	return e.exec.CommandContext(ctx, cmd, args...)
}

func (e *contextExec) LookPath(file string) (string, error) { return e.exec.LookPath(file) }
