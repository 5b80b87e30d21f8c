package lvm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

const (
	defaultCommand = "lvm"
	defaultTimeout = 2 * time.Minute
	// killDelay is how long an lvm that was asked to stop (SIGINT, which LVM
	// honours at safe points between metadata updates) may take before it is
	// killed outright.
	killDelay = 10 * time.Second
)

// output is what one lvm command left behind.
type output struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int
}

// runner runs one lvm command line (args[0] is the subcommand). A non-zero
// exit status is an output, not an error; the error is for commands that
// could not run or were stopped. Unit tests replace it with a function of
// argv; the real one is execRunner.
type runner interface {
	run(ctx context.Context, args []string) (output, error)
}

// runnerFunc lets a plain function be a runner.
type runnerFunc func(ctx context.Context, args []string) (output, error)

func (f runnerFunc) run(ctx context.Context, args []string) (output, error) { return f(ctx, args) }

// execRunner runs `<command> <args...>` directly, never through a shell.
type execRunner struct {
	command string
	env     []string
	// killDelay overrides the package's killDelay (tests).
	killDelay time.Duration
}

// commandEnv is the environment of every lvm command: the caller's (so that
// LVM_SYSTEM_DIR is kept), the C locale so messages and numbers do not
// depend on the node's language, no fd-leak warnings, then opts.Env, which
// wins over all of these (exec keeps the last value of a duplicated key).
func commandEnv(extra []string) []string {
	env := append(os.Environ(), "LC_ALL=C", "LVM_SUPPRESS_FD_WARNINGS=1")
	return append(env, extra...)
}

func (r execRunner) run(ctx context.Context, args []string) (output, error) {
	cmd := exec.CommandContext(ctx, r.command, args...)
	cmd.Env = r.env
	// Stdin stays nil (/dev/null): a prompt LVM did not expect reads EOF and
	// answers "no" instead of hanging.
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = killDelay
	if r.killDelay > 0 {
		cmd.WaitDelay = r.killDelay
	}
	err := cmd.Run()
	out := output{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return out, nil
	case ctx.Err() != nil:
		// Stopped by the deadline: whatever the exit status, the cause is
		// the context.
		out.ExitCode = -1
		return out, ctx.Err()
	case errors.As(err, &exitErr) && exitErr.Exited():
		out.ExitCode = exitErr.ExitCode()
		return out, nil
	default:
		out.ExitCode = -1
		return out, err
	}
}

// run runs one lvm command with a deadline, reports its duration to the
// observer and turns a failure into a *CommandError. On success it returns
// stdout.
func (c *Client) run(ctx context.Context, args ...string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	start := time.Now()
	out, err := c.runner.run(ctx, args)
	d := time.Since(start)
	if err == nil && out.ExitCode != 0 {
		err = &CommandError{Args: args, ExitCode: out.ExitCode, Stderr: string(out.Stderr)}
	} else if err != nil {
		err = &CommandError{Args: args, ExitCode: out.ExitCode, Stderr: string(out.Stderr), Err: err}
	}
	if c.observer != nil {
		c.observer.ObserveCommand(args[0], d, err)
	}
	if err != nil {
		klog.V(2).InfoS("lvm command failed", "args", args, "duration", d, "err", err)
		return out.Stdout, err
	}
	klog.V(4).InfoS("lvm command", "args", args, "duration", d)
	return out.Stdout, nil
}
