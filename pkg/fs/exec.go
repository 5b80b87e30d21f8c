package fs

import (
	"context"
	"slices"
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
	// probe is the answer of the last blkid run (or of ReadsBlank), kept
	// for one replay when replayProbe is set: SafeFormatAndMount reads the
	// signature itself right before it formats, and FormatAndMount has
	// just read it. Any other command run through this exec drops it.
	replayProbe bool
	probe       *probeAnswer
}

// probeAnswer is what one blkid run printed and returned, or, with
// blank set, what ReadsBlank found (see answerBlank): then it answers a
// blkid of any arguments whose last one is device.
type probeAnswer struct {
	args   []string
	blank  bool
	device string
	out    []byte
	err    error
}

// answerBlank makes the next blkid of device, when nothing else runs
// before it, answer what blkid answers for a device without any
// signature (exit status 2, no output): ReadsBlank has just found it so.
func (e *contextExec) answerBlank(device string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.probe = &probeAnswer{blank: true, device: device, err: noSignatureError{}}
}

// noSignatureError is blkid's exit status 2: "no signature found".
type noSignatureError struct{}

var _ utilexec.ExitError = noSignatureError{}

func (noSignatureError) Error() string {
	return "exit status 2 (no signature; the device reads as zeros where signatures live)"
}
func (noSignatureError) String() string  { return noSignatureError{}.Error() }
func (noSignatureError) Exited() bool    { return true }
func (noSignatureError) ExitStatus() int { return 2 }

var _ utilexec.Interface = (*contextExec)(nil)

func (e *contextExec) Command(cmd string, args ...string) utilexec.Cmd {
	return &timedCmd{Cmd: e.exec.CommandContext(e.ctx, cmd, args...), name: cmd, args: args, owner: e}
}

func (e *contextExec) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	return &timedCmd{Cmd: e.exec.CommandContext(ctx, cmd, args...), name: cmd, args: args, owner: e}
}

func (e *contextExec) LookPath(file string) (string, error) { return e.exec.LookPath(file) }

// record notes a command that ran: its time, and, for a blkid whose
// output was read (answer not nil), its answer.
func (e *contextExec) record(name string, d time.Duration, answer *probeAnswer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.times == nil {
		e.times = map[string]time.Duration{}
	}
	e.times[name] += d
	e.probe = nil
	if name == "blkid" && e.replayProbe && answer != nil {
		e.probe = answer
	}
}

// replay returns, once, the answer of the blkid run just before when the
// arguments are the same and no other command ran since; nil otherwise.
func (e *contextExec) replay(name string, args []string) *probeAnswer {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.probe
	if name != "blkid" || p == nil {
		return nil
	}
	if p.blank && (len(args) == 0 || args[len(args)-1] != p.device) || !p.blank && !slices.Equal(p.args, args) {
		return nil
	}
	e.probe = nil
	return p
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
	args  []string
	owner *contextExec
}

func (c *timedCmd) CombinedOutput() ([]byte, error) {
	if p := c.owner.replay(c.name, c.args); p != nil {
		return slices.Clone(p.out), p.err
	}
	start := time.Now()
	out, err := c.Cmd.CombinedOutput()
	c.owner.record(c.name, time.Since(start), &probeAnswer{args: slices.Clone(c.args), out: slices.Clone(out), err: err})
	return out, err
}

func (c *timedCmd) Output() ([]byte, error) {
	start := time.Now()
	out, err := c.Cmd.Output()
	c.owner.record(c.name, time.Since(start), nil)
	return out, err
}

func (c *timedCmd) Run() error {
	start := time.Now()
	err := c.Cmd.Run()
	c.owner.record(c.name, time.Since(start), nil)
	return err
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
