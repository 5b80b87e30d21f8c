package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// stopGrace is how long a process gets between SIGTERM and SIGKILL.
const stopGrace = 10 * time.Second

// Process is one started program whose output goes to a log file.
type Process struct {
	Name    string
	LogPath string

	cmd    *exec.Cmd
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// startProcess starts bin with args and env (added to a minimal
// environment) and writes its output to dir/name.log. The process is killed
// when ctx ends or lifetime passes, whichever comes first, and when this
// process dies (Pdeathsig), so nothing outlives a crashed test.
func startProcess(ctx context.Context, dir, name, bin string, args, env []string, lifetime time.Duration) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log file of %s: %w", name, err)
	}
	pctx, cancel := context.WithTimeout(ctx, lifetime)
	cmd := exec.CommandContext(pctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LC_ALL=C"}, env...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// On deadline, ask politely first; WaitDelay then kills.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	_, err = fmt.Fprintf(logFile, "### %s %s\n", bin, strings.Join(args, " "))
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		cancel()
		return nil, errors.Join(fmt.Errorf("start %s: %w", name, err), logFile.Close())
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, cancel: cancel, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if err := logFile.Close(); err != nil {
			klog.ErrorS(err, "Closing the process log failed; its last lines may be lost", "process", name, "log", logPath)
		}
		close(p.done)
	}()
	klog.V(2).InfoS("Started", "process", name, "pid", cmd.Process.Pid, "log", logPath)
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited tells whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process (by its own pid), waits up to the grace
// period, then kills it. Stopping an ended process is a no-op.
func (p *Process) Stop() {
	if ended, _ := p.Exited(); ended {
		p.cancel()
		return
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		klog.ErrorS(err, "SIGTERM failed", "process", p.Name, "pid", p.Pid())
	}
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		klog.InfoS("Killing after grace period", "process", p.Name, "pid", p.Pid(), "grace", stopGrace)
		if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			klog.ErrorS(err, "SIGKILL failed", "process", p.Name, "pid", p.Pid())
		}
		<-p.done
	}
	p.cancel()
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string { return tailFile(p.LogPath, n) }

func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, 64<<20))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if err := errors.Join(sc.Err(), f.Close()); err != nil {
		lines = append(lines, fmt.Sprintf("(reading %s failed: %v)", path, err))
	}
	return strings.Join(lines, "\n")
}

// FreePort asks the kernel for a TCP port free on every address: the
// processes listen on 127.0.0.1 or on the host's own address (node agents'
// node channel), and a port asked on 127.0.0.1 alone may be one an agent
// already holds on the host's address (60 simulated nodes met that: one
// agent failed to bind and its endpoint reached another node's agent, whose
// enrollment the controller refused). The port is released before use, so
// a race with another program is possible but rare: the program that loses
// fails to start and says so.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("release free port %d: %w", port, err)
	}
	return port, nil
}

// runCommand runs a short command with a deadline and returns its combined
// output; the error names the command and carries its output.
func runCommand(ctx context.Context, timeout time.Duration, env []string, name string, args ...string) ([]byte, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// started drops the processes that were never started (nil).
func started(ps ...*Process) []*Process {
	var out []*Process
	for _, p := range ps {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}
