package lvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
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
	// A read that ignores SIGINT is killed killDelay later. A mutation
	// never is (WaitDelay 0): LVM blocks signals while it commits metadata
	// or holds a device suspended, and a SIGKILL there can leave the VG
	// half-written or an LV suspended with its I/O hanging.
	if !isMutation(args) {
		cmd.WaitDelay = killDelay
		if r.killDelay > 0 {
			cmd.WaitDelay = r.killDelay
		}
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

// mutations are the lvm subcommands that change metadata or device state.
var mutations = map[string]bool{"lvcreate": true, "lvextend": true, "lvremove": true, "lvchange": true,
	"lvrename": true, "lvconvert": true, "lvresize": true, "vgchange": true}

// noMonitoring and archiveRetention share the one --config lvm takes per
// mutation (docs/lvm.md, "lvm2 in the node's container"). Without
// activation/monitoring=0, activating a thin pool or a copy-on-write snapshot
// starts a dmeventd inside the container that the host's never hears of;
// carve relies on no monitoring. backup/retain_days=0 (not for an activation)
// bounds the metadata archive to retain_min files per volume group: LVM's 30
// days grew a busy group's archive to 675 MiB in 2201 files. LVM expires only
// the archives of groups it archives again, so only carve's are affected.
const (
	noMonitoring     = "activation/monitoring=0"
	archiveRetention = "backup/retain_days=0"
)

// withMutationConfig adds --config with noMonitoring and, unless the
// command only activates, archiveRetention right after the subcommand of
// a mutation.
func withMutationConfig(args []string) []string {
	if len(args) == 0 {
		return args
	}
	config := noMonitoring
	if !slices.Contains(args, "--activate") {
		config += " " + archiveRetention
	}
	out := append([]string{args[0]}, "--config", config)
	return append(out, args[1:]...)
}

func isMutation(args []string) bool { return len(args) > 0 && mutations[args[0]] }

// hungGrace is how long a read may go on after its deadline and kill
// before the caller stops waiting for it: a process in uninterruptible
// sleep (a disk that stopped answering) outlives even SIGKILL, and its
// caller must not.
const hungGrace = 5 * time.Second

// run runs one read-only lvm command with a deadline, reports its
// duration to the observer and turns a failure into a *CommandError. On
// success it returns stdout. The deadline is the context's or
// Options.Timeout from now, whichever comes first. A command that has not
// exited killDelay+hungGrace after its deadline is given up on (it goes on
// in the background until the kernel lets it die).
func (c *Client) run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	type result struct {
		out output
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		out, err := c.runner.run(ctx, args)
		done <- result{out, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		select {
		case res = <-done:
		case <-time.After(c.killDelay() + c.hungGrace):
			res = result{output{ExitCode: -1}, fmt.Errorf("lvm did not exit %s after its deadline (hung in the kernel?): %w",
				c.killDelay()+c.hungGrace, ctx.Err())}
		}
	}
	return c.finish(args, start, res.out, res.err)
}

// mutate runs an lvm command that changes LVM's state, under the VG lock the
// caller took (*unlock releases it). The command is never killed: it runs
// detached from ctx, bounded by Options.Timeout (then SIGINT, which LVM
// honours between metadata updates). When ctx ends first mutate returns at
// once, but the VG lock stays held until the command exits (*unlock becomes a
// no-op), so no other mutation of the VG starts meanwhile.
func (c *Client) mutate(ctx context.Context, unlock *func(), args ...string) ([]byte, error) {
	args = withMutationConfig(args)
	type result struct {
		out output
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	c.running.Add(1)
	go func() {
		defer c.running.Done()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
		defer cancel()
		out, err := c.runner.run(rctx, args)
		done <- result{out, err}
	}()
	select {
	case res := <-done:
		return c.finish(args, start, res.out, res.err)
	case <-ctx.Done():
	}
	release := *unlock
	*unlock = func() {}
	go func() {
		res := <-done
		release()
		_, err := c.finish(args, start, res.out, res.err)
		klog.InfoS("An lvm command whose caller gave up has ended", "args", args, "duration", time.Since(start), "err", err)
	}()
	return nil, &CommandError{Args: args, ExitCode: -1, Err: fmt.Errorf("still running, left to finish in the background: %w", ctx.Err())}
}

// Settle returns once no mutation of volume group vg runs (one whose
// caller gave up included: it holds the VG lock until it exits), or ctx
// ends (its error then).
func (c *Client) Settle(ctx context.Context, vg string) error {
	unlock, err := c.locks.Lock(ctx, vg)
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// Wait waits until the mutations that outlived their callers have ended,
// or ctx ends (its error then). Shutdown calls it, so that the process
// does not exit under an lvm that is writing metadata.
func (c *Client) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		c.running.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lvm commands still running: %w", ctx.Err())
	}
}

// killDelay is how long the runner lets a stopped read go on before it
// kills it; runners that are not processes (tests) kill nothing.
func (c *Client) killDelay() time.Duration {
	r, ok := c.runner.(execRunner)
	switch {
	case !ok:
		return 0
	case r.killDelay > 0:
		return r.killDelay
	}
	return killDelay
}

func (c *Client) finish(args []string, start time.Time, out output, err error) ([]byte, error) {
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
