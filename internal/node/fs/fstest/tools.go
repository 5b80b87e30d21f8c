// Package fstest fakes the filesystem tools as a k8s.io/utils/exec Interface
// that keeps each device's signature.
package fstest

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"
)

// Tools is the fake. The zero value is not usable; call New.
type Tools struct {
	mu sync.Mutex
	// formats maps a device to what blkid reports ("" or absent: none).
	formats map[string]string
	sizes   map[string]uint64
	fail    map[string]error
	failIf  []failRule
	calls   [][]string
	ctxs    []context.Context
	ctxErrs []error
	holds   map[string]chan struct{}
	// unfinished: an mkfs did not finish; mounted: once mounted read-write.
	unfinished, mounted map[string]bool
}

var _ utilexec.Interface = (*Tools)(nil)

// New returns a fake with blank devices.
func New() *Tools {
	return &Tools{formats: map[string]string{}, sizes: map[string]uint64{}, fail: map[string]error{},
		unfinished: map[string]bool{}, mounted: map[string]bool{}}
}

// PartitionTable is a partition table signature for SetFormat.
const PartitionTable = "PTTYPE=gpt"

// SetFormat puts a signature on device.
func (t *Tools) SetFormat(device, format string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.formats[device] = format
	delete(t.unfinished, device)
}

// SetRemains puts what an unfinished mkfs of fsType leaves on device.
func (t *Tools) SetRemains(device, fsType string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.formats[device] = fsType
	t.unfinished[device] = true
}

// SetMounted marks device's superblock as once mounted read-write.
func (t *Tools) SetMounted(device string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mounted[device] = true
}

// ReadHead implements fs.HeadReader.
func (t *Tools) ReadHead(device string, n int) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	head := make([]byte, max(n, 2048))
	switch t.formats[device] {
	case "xfs":
		copy(head, "XFSB")
		if t.unfinished[device] {
			head[126] = 1 // sb_inprogress
		}
	case "ext2", "ext3", "ext4":
		binary.LittleEndian.PutUint16(head[1024+56:], 0xEF53) // s_magic
		if t.mounted[device] {
			binary.LittleEndian.PutUint32(head[1024+44:], 1764115200) // s_mtime
			binary.LittleEndian.PutUint16(head[1024+52:], 1)          // s_mnt_count
		}
	}
	return head[:n], nil
}

// Format returns the signature on device.
func (t *Tools) Format(device string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.formats[device]
}

// SetSize sets what blockdev --getsize64 prints for path.
func (t *Tools) SetSize(path string, size uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sizes[path] = size
}

// Fail makes every later run of command fail with err.
func (t *Tools) Fail(command string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fail[command] = err
}

type failRule struct {
	match func(argv []string) bool
	err   error
}

// FailIf makes every later run whose argv match accepts fail with err.
func (t *Tools) FailIf(match func(argv []string) bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failIf = append(t.failIf, failRule{match: match, err: err})
}

// Hold keeps later runs of command running until release; one whose context
// ends first fails, as the real one would be killed.
func (t *Tools) Hold(command string) (release func()) {
	ch := make(chan struct{})
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.holds == nil {
		t.holds = map[string]chan struct{}{}
	}
	t.holds[command] = ch
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// Calls returns the argv of every command run so far.
func (t *Tools) Calls() [][]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([][]string(nil), t.calls...)
}

// Ran returns the argv of the commands called name.
func (t *Tools) Ran(name string) [][]string {
	var out [][]string
	for _, c := range t.Calls() {
		if c[0] == name {
			out = append(out, c)
		}
	}
	return out
}

// Contexts returns each command's context (context.TODO via Command).
func (t *Tools) Contexts() []context.Context {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]context.Context(nil), t.ctxs...)
}

// ContextErrors returns each command's ctx.Err() as it ran.
func (t *Tools) ContextErrors() []error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]error(nil), t.ctxErrs...)
}

// Command implements utilexec.Interface, under context.TODO.
func (t *Tools) Command(cmd string, args ...string) utilexec.Cmd {
	return t.command(context.TODO(), cmd, args)
}

// CommandContext implements utilexec.Interface.
func (t *Tools) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	return t.command(ctx, cmd, args)
}

func (t *Tools) command(ctx context.Context, cmd string, args []string) utilexec.Cmd {
	argv := append([]string{cmd}, args...)
	action := func() ([]byte, []byte, error) {
		out, err := t.run(ctx, argv)
		return out, nil, err
	}
	fc := &testingexec.FakeCmd{
		CombinedOutputScript: []testingexec.FakeAction{action},
		OutputScript:         []testingexec.FakeAction{action},
		RunScript:            []testingexec.FakeAction{action},
	}
	return testingexec.InitFakeCmd(fc, cmd, args...)
}

// LookPath finds every tool.
func (t *Tools) LookPath(file string) (string, error) { return "/usr/sbin/" + file, nil }

func (t *Tools) run(ctx context.Context, argv []string) ([]byte, error) {
	t.mu.Lock()
	t.calls = append(t.calls, argv)
	t.ctxs = append(t.ctxs, ctx)
	t.ctxErrs = append(t.ctxErrs, ctx.Err())
	hold := t.holds[argv[0]]
	t.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return []byte(argv[0] + " killed"), fmt.Errorf("%s killed: %w", argv[0], ctx.Err())
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.fail[argv[0]]; err != nil {
		return []byte(argv[0] + " failed"), err
	}
	for _, r := range t.failIf {
		if r.match(argv) {
			return []byte(argv[0] + " failed"), r.err
		}
	}
	last := argv[len(argv)-1]
	switch name := argv[0]; {
	case name == "blkid":
		f := t.formats[last]
		switch {
		case f == "":
			return nil, testingexec.FakeExitError{Status: 2}
		case strings.HasPrefix(f, "PTTYPE="):
			return []byte(f + "\n"), nil
		}
		return []byte("DEVNAME=" + last + "\nTYPE=" + f + "\n"), nil
	case strings.HasPrefix(name, "mkfs."):
		t.formats[last] = strings.TrimPrefix(name, "mkfs.")
		delete(t.unfinished, last)
		delete(t.mounted, last)
		return nil, nil
	case name == "e2fsck" && t.unfinished[last]:
		return []byte(last + ": bad superblock"), testingexec.FakeExitError{Status: 4}
	case name == "blockdev":
		size, ok := t.sizes[last]
		if !ok {
			return []byte("blockdev: cannot open " + last), testingexec.FakeExitError{Status: 1}
		}
		return []byte(fmt.Sprintf("%d\n", size)), nil
	}
	return nil, nil
}
