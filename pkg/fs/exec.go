package fs

import (
	"context"
	"sync"
	"time"

	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// contextExec binds every command that mount-utils runs through
// Command (blkid, mkfs, fsck, resize2fs, xfs_growfs, btrfs) to ctx, and
// remembers how long each one took so that mkfs can be timed apart from
// mount.
type contextExec struct {
	ctx  context.Context
	exec utilexec.Interface

	mu    sync.Mutex
	times map[string]time.Duration
}

var _ utilexec.Interface = (*contextExec)(nil)

func (e *contextExec) Command(cmd string, args ...string) utilexec.Cmd {
	return &timedCmd{Cmd: e.exec.CommandContext(e.ctx, cmd, args...), name: cmd, owner: e}
}

func (e *contextExec) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	return &timedCmd{Cmd: e.exec.CommandContext(ctx, cmd, args...), name: cmd, owner: e}
}

func (e *contextExec) LookPath(file string) (string, error) { return e.exec.LookPath(file) }

func (e *contextExec) record(name string, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.times == nil {
		e.times = map[string]time.Duration{}
	}
	e.times[name] += d
}

// took returns the total time spent in commands called name, and whether
// any ran.
func (e *contextExec) took(name string) (time.Duration, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, ok := e.times[name]
	return d, ok
}

// timedCmd times the ways mount-utils runs a command.
type timedCmd struct {
	utilexec.Cmd
	name  string
	owner *contextExec
}

func (c *timedCmd) CombinedOutput() ([]byte, error) {
	start := time.Now()
	defer func() { c.owner.record(c.name, time.Since(start)) }()
	return c.Cmd.CombinedOutput()
}

func (c *timedCmd) Output() ([]byte, error) {
	start := time.Now()
	defer func() { c.owner.record(c.name, time.Since(start)) }()
	return c.Cmd.Output()
}

func (c *timedCmd) Run() error {
	start := time.Now()
	defer func() { c.owner.record(c.name, time.Since(start)) }()
	return c.Cmd.Run()
}

// timedMounter times the mounts SafeFormatAndMount makes.
type timedMounter struct {
	mount.Interface
	ran  bool
	took time.Duration
}

func (m *timedMounter) Mount(source, target, fsType string, options []string) error {
	return m.MountSensitive(source, target, fsType, options, nil)
}

func (m *timedMounter) MountSensitive(source, target, fsType string, options, sensitive []string) error {
	m.ran = true
	start := time.Now()
	defer func() { m.took += time.Since(start) }()
	return m.Interface.MountSensitive(source, target, fsType, options, sensitive)
}
