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
	// killDelay is how long a stopped lvm (SIGINT, honoured between metadata
	// updates) may take before it is killed.
	killDelay = 10 * time.Second
)

type output struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int
}

// runner runs one lvm command line; a non-zero exit is an output, not an
// error. Tests replace it.
type runner interface {
	run(ctx context.Context, args []string) (output, error)
}

type runnerFunc func(ctx context.Context, args []string) (output, error)

func (f runnerFunc) run(ctx context.Context, args []string) (output, error) { return f(ctx, args) }

type execRunner struct {
	command   string
	env       []string
	killDelay time.Duration
}

// commandEnv sets the C locale and no fd-leak warnings; opts.Env wins.
func commandEnv(extra []string) []string {
	env := append(os.Environ(), "LC_ALL=C", "LVM_SUPPRESS_FD_WARNINGS=1")
	return append(env, extra...)
}

func (r execRunner) run(ctx context.Context, args []string) (output, error) {
	cmd := exec.CommandContext(ctx, r.command, args...)
	cmd.Env = r.env
	// Stdin is /dev/null: an unexpected prompt reads EOF and answers "no".
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	// Only reads are killed. LVM blocks signals while it commits metadata or
	// holds a device suspended, and a SIGKILL there can leave the VG
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

// noMonitoring and archiveRetention share the one --config per mutation
// (docs/lvm.md). Without activation/monitoring=0, activating a thin pool or
// snapshot starts a dmeventd in the container that the host never hears of.
// backup/retain_days=0 bounds each VG's metadata archive to retain_min files
// (LVM's 30 days grew a busy group's to 675 MiB); LVM expires only archives
// of groups it archives again, so only carve's are affected.
const (
	noMonitoring     = "activation/monitoring=0"
	archiveRetention = "backup/retain_days=0"
)

// withMutationConfig adds --config after a mutation's subcommand.
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

// hungGrace is how long a read may go on after its deadline and kill: a
// process in uninterruptible sleep outlives SIGKILL, and its caller must not.
const hungGrace = 5 * time.Second

// run runs one read-only lvm command with a deadline (the context's or
// Options.Timeout) and returns stdout or a *CommandError. A command still
// running killDelay+hungGrace after its deadline is given up on.
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

// mutate runs a state-changing lvm command under the VG lock the caller
// took. It is never killed: it runs detached from ctx, bounded by
// Options.Timeout (then SIGINT). When ctx ends first mutate returns at once
// but the VG lock stays held until the command exits (*unlock becomes a
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

// Settle waits until no mutation of vg runs, or ctx ends.
func (c *Client) Settle(ctx context.Context, vg string) error {
	unlock, err := c.locks.Lock(ctx, vg)
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// Wait waits for mutations that outlived their callers, or ctx; shutdown
// calls it so the process does not exit under an lvm writing metadata.
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

// killDelay: runners that are not processes (tests) kill nothing.
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
