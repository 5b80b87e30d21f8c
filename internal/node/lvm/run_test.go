package lvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The real exec runner is tested against this test binary acting as lvm:
// with CARVE_LVM_HELPER=1 in its environment, TestMain runs helperLVM
// instead of the tests.
const helperEnv = "CARVE_LVM_HELPER=1"

func TestMain(m *testing.M) {
	if os.Getenv("CARVE_LVM_HELPER") == "1" {
		os.Exit(helperLVM(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func helperLVM(args []string) int {
	switch args[0] {
	case "printenv":
		for _, kv := range os.Environ() {
			fmt.Println(kv)
		}
		return 0
	case "fail":
		fmt.Fprint(os.Stderr, "  Volume group \"x\" has insufficient free space\n")
		return 5
	case "sleep":
		time.Sleep(time.Minute)
		return 0
	case "ignoreint":
		signal.Ignore(syscall.SIGINT)
		time.Sleep(time.Minute)
		return 0
	case "lvchange":
		// A mutation that takes a while and ignores SIGINT, as LVM does
		// while it commits metadata; it leaves its last argument behind
		// when it ran to its end.
		signal.Ignore(syscall.SIGINT)
		if err := os.WriteFile(args[len(args)-1]+".started", nil, 0o600); err != nil {
			return 1
		}
		d, err := time.ParseDuration(os.Getenv("CARVE_LVM_HELPER_SLEEP"))
		if err != nil {
			d = 3 * time.Second
		}
		time.Sleep(d)
		if err := os.WriteFile(args[len(args)-1], []byte("done"), 0o600); err != nil {
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "no such command %q\n", args[0])
	return exitNoSuchCommand
}

func helperClient(opts Options) *Client {
	opts.Command = os.Args[0]
	opts.Env = append([]string{helperEnv}, opts.Env...)
	return New(opts)
}

func TestExecEnvironment(t *testing.T) {
	t.Setenv("LVM_SYSTEM_DIR", "/caller/lvm")
	t.Setenv("LC_ALL", "de_DE.UTF-8")
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{"caller's LVM_SYSTEM_DIR kept, C locale", nil,
			[]string{"LVM_SYSTEM_DIR=/caller/lvm", "LC_ALL=C", "LVM_SUPPRESS_FD_WARNINGS=1"}},
		{"Options.Env wins", []string{"LVM_SYSTEM_DIR=/opts/lvm", "DM_DISABLE_UDEV=1"},
			[]string{"LVM_SYSTEM_DIR=/opts/lvm", "DM_DISABLE_UDEV=1", "LC_ALL=C"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := helperClient(Options{Env: tt.env}).run(context.Background(), "printenv")
			if err != nil {
				t.Fatal(err)
			}
			env := strings.Split(strings.TrimSpace(string(out)), "\n")
			for _, kv := range tt.want {
				if !slices.Contains(env, kv) {
					t.Errorf("environment lacks %s", kv)
				}
			}
			// One value per key: no LC_ALL=de_DE beside LC_ALL=C.
			seen := map[string]bool{}
			for _, kv := range env {
				k, _, _ := strings.Cut(kv, "=")
				if seen[k] {
					t.Errorf("%s appears twice", k)
				}
				seen[k] = true
			}
		})
	}
}

func TestExecFailureIsCommandError(t *testing.T) {
	obs := &recordingObserver{}
	_, err := helperClient(Options{Observer: obs}).run(context.Background(), "fail", "--flag")
	var ce *CommandError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is no *CommandError", err)
	}
	if ce.ExitCode != 5 || !strings.Contains(ce.Stderr, "insufficient free space") ||
		!slices.Equal(ce.Args, []string{"fail", "--flag"}) || ce.Kind != nil || ce.Err != nil {
		t.Errorf("CommandError %+v", ce)
	}
	if want := `lvm fail --flag: exit code 5: Volume group "x" has insufficient free space`; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	if !slices.Equal(obs.commands, []string{"fail"}) || obs.errs[0] == nil {
		t.Errorf("observer saw %v %v", obs.commands, obs.errs)
	}
}

func TestExecDeadline(t *testing.T) {
	tests := []struct {
		name    string
		cmd     string
		timeout time.Duration // Options.Timeout; the context has no deadline
		ctxTime time.Duration // a context deadline instead
	}{
		{"default timeout applies", "sleep", 200 * time.Millisecond, 0},
		{"context deadline applies", "sleep", time.Hour, 200 * time.Millisecond},
		// --lvm-timeout bounds a command whose caller allows longer.
		{"timeout applies under a later context deadline", "sleep", 200 * time.Millisecond, time.Hour},
		{"killed when the interrupt is ignored", "ignoreint", 200 * time.Millisecond, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := helperClient(Options{Timeout: tt.timeout})
			c.runner = execRunner{command: os.Args[0], env: commandEnv([]string{helperEnv}), killDelay: 300 * time.Millisecond}
			ctx := context.Background()
			if tt.ctxTime > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctxTime)
				defer cancel()
			}
			start := time.Now()
			_, err := c.run(ctx, tt.cmd)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("error %v, want DeadlineExceeded", err)
			}
			var ce *CommandError
			if !errors.As(err, &ce) || ce.ExitCode != -1 {
				t.Errorf("error %v: want a CommandError with exit code -1", err)
			}
			if !strings.Contains(err.Error(), "context deadline exceeded") {
				t.Errorf("error %q does not say the deadline passed", err)
			}
			// The helper sleeps a minute: it was stopped, not waited for.
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

func TestExecMissingBinary(t *testing.T) {
	c := New(Options{Command: "/nonexistent/lvm"})
	_, err := c.Report(context.Background())
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Err == nil || ce.ExitCode != -1 {
		t.Fatalf("error %v, want a CommandError wrapping the exec failure", err)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %v does not wrap os.ErrNotExist", err)
	}
}

func TestDevDirFromEnv(t *testing.T) {
	tests := []struct {
		env  []string
		want string
	}{
		{nil, "/dev/vg/lv"},
		{[]string{"DM_DEV_DIR=/alt/dev"}, "/alt/dev/vg/lv"},
	}
	for _, tt := range tests {
		c := newClient(Options{}, nil, tt.env)
		if got := c.lvPath("vg", "lv"); got != tt.want {
			t.Errorf("env %v: path %s, want %s", tt.env, got, tt.want)
		}
	}
}

func TestCommandErrorMessage(t *testing.T) {
	tests := []struct {
		name string
		err  CommandError
		want string
	}{
		{"exit code and stderr lines", CommandError{Args: []string{"lvremove", "--yes", "vg/lv"}, ExitCode: 5,
			Stderr: "  WARNING: Activation disabled.\n  Failed to find logical volume \"vg/lv\"\n"},
			`lvm lvremove --yes vg/lv: exit code 5: WARNING: Activation disabled.; Failed to find logical volume "vg/lv"`},
		{"no stderr", CommandError{Args: []string{"lvs"}, ExitCode: 5}, "lvm lvs: exit code 5"},
		{"stopped", CommandError{Args: []string{"lvs"}, ExitCode: -1, Err: context.DeadlineExceeded},
			"lvm lvs: context deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestMutationIsNeverKilled: an lvm mutation whose caller's deadline
// passes is neither killed (even past Options.Timeout and killDelay) nor
// cut off from its VG lock: the caller gets its context's error at once,
// the command runs to its end holding the lock, and Wait waits for it.
func TestMutationIsNeverKilled(t *testing.T) {
	// The deadline's SIGINT must come after the command ignores it, as LVM
	// does while it commits; on a loaded machine starting the helper can
	// take longer than a short deadline, so an attempt whose command never
	// got that far is made again with a longer one.
	for timeout := 100 * time.Millisecond; timeout < time.Minute; timeout *= 4 {
		if mutationOutlivesDeadline(t, timeout) {
			return
		}
		t.Logf("the command did not start within its %v deadline; again with a longer one", timeout)
	}
	t.Fatal("the command never started within its deadline")
}

// mutationOutlivesDeadline runs one mutation whose caller gives up once it
// runs, with Options.Timeout timeout; false if the command never started.
func mutationOutlivesDeadline(t *testing.T, timeout time.Duration) bool {
	t.Helper()
	c := helperClient(Options{Timeout: timeout})
	// The command outlives the deadline and the kill a read would get by far.
	sleep := "CARVE_LVM_HELPER_SLEEP=" + (3*timeout + 2*time.Second).String()
	c.runner = execRunner{command: os.Args[0], env: commandEnv([]string{helperEnv, sleep}), killDelay: 200 * time.Millisecond}
	marker := filepath.Join(t.TempDir(), "done")
	unlock, err := c.locks.Lock(context.Background(), "vg")
	if err != nil {
		t.Fatal(err)
	}
	// The caller gives up once the command runs (and ignores SIGINT, as
	// LVM does while it commits): judged by markers, not a clock, since on
	// a loaded machine starting the helper alone can take most of a second.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			if _, err := os.Stat(marker + ".started"); err == nil {
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	_, err = c.mutate(ctx, &unlock, "lvchange", marker)
	if _, startErr := os.Stat(marker + ".started"); startErr != nil {
		unlock()
		return false
	}
	_, statErr := os.Stat(marker)
	if !errors.Is(err, context.Canceled) || statErr == nil {
		t.Fatalf("mutate = %v after %v (command ended: %v); want the caller's Canceled before the command ends", err, time.Since(start), statErr == nil)
	}
	unlock() // the caller's deferred release: a no-op now
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	if release, err := c.locks.Lock(short, "vg"); err == nil {
		release()
		if _, statErr := os.Stat(marker); statErr != nil {
			t.Fatal("the VG lock was free while the mutation still ran")
		}
	}
	wctx, cancelWait := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelWait()
	if err := c.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the mutation did not run to its end (killed?): %v", err)
	}
	again, err := c.locks.Lock(wctx, "vg")
	if err != nil {
		t.Fatalf("the VG lock stayed taken after the mutation ended: %v", err)
	}
	again()
	return true
}

// TestReadGivesUpOnAHungCommand: a read whose process outlives its
// deadline and kill (uninterruptible sleep on a dead disk) does not hold
// its caller: run returns the context's error a bounded time later.
func TestReadGivesUpOnAHungCommand(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	c := newClient(Options{Timeout: time.Hour}, runnerFunc(func(context.Context, []string) (output, error) {
		<-release // ignores its context, as a process in D state does
		return output{}, nil
	}), nil)
	c.hungGrace = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.run(ctx, "fullreport")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not exit") {
		t.Fatalf("run = %v; want DeadlineExceeded saying lvm did not exit", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("run returned after %v", d)
	}
}

// TestMetadataWritesBoundTheArchive: every command that writes VG metadata
// carries backup/retain_days=0 in the --config right after its
// subcommand, so that LVM keeps only lvm.conf's retain_min newest archive
// files of the VG; an activation writes none and carries only
// activation/monitoring=0 (TestMutationsStartNoDmeventd).
func TestMetadataWritesBoundTheArchive(t *testing.T) {
	for _, tt := range mutationCases() {
		t.Run(tt.name, func(t *testing.T) {
			want := []string{"--config", "activation/monitoring=0"}
			if tt.writes {
				want[1] += " backup/retain_days=0"
			}
			for _, argv := range runMutation(t, tt) {
				if !slices.Equal(argv[1:min(3, len(argv))], want) {
					t.Errorf("%q: want %q right after the subcommand", argv, want)
				}
			}
		})
	}
}

// TestMutationsStartNoDmeventd: every mutation carries exactly one
// --config (lvm refuses a second), and it turns dmeventd monitoring off,
// so that no lvm of carve's starts a dmeventd inside the node's container.
func TestMutationsStartNoDmeventd(t *testing.T) {
	for _, tt := range mutationCases() {
		t.Run(tt.name, func(t *testing.T) {
			for _, argv := range runMutation(t, tt) {
				n, at := 0, -1
				for i, a := range argv {
					if a == "--config" {
						n, at = n+1, i
					}
				}
				if n != 1 || at+1 >= len(argv) || !slices.Contains(strings.Fields(argv[at+1]), "activation/monitoring=0") {
					t.Errorf("%q: want one --config with activation/monitoring=0", argv)
				}
			}
		})
	}
}

// mutationCase is one mutation of the Client and the lvm subcommand it
// runs; writes: the command writes VG metadata.
type mutationCase struct {
	name    string
	do      func(ctx context.Context, c *Client) error
	command string
	writes  bool
}

func mutationCases() []mutationCase {
	return []mutationCase{
		{"create", func(ctx context.Context, c *Client) error {
			_, err := c.CreateLV(ctx, CreateRequest{VolumeGroup: "rec-thick", Name: "carve-new", Size: 4 << 20})
			return err
		}, "lvcreate", true},
		{"thin snapshot", func(ctx context.Context, c *Client) error {
			_, err := c.CreateThinSnapshot(ctx, "rec-thin", "thin1", "carve-snap", []string{"t"})
			return err
		}, "lvcreate", true},
		{"extend", func(ctx context.Context, c *Client) error {
			_, err := c.ExtendLV(ctx, "rec-thick", "carve-aaaa", 64<<20)
			return err
		}, "lvextend", true},
		{"delete tags", func(ctx context.Context, c *Client) error {
			return c.DeleteTags(ctx, "rec-thick", "carve-aaaa", "carve.dev/unfinished")
		}, "lvchange", true},
		{"remove", func(ctx context.Context, c *Client) error { return c.RemoveLV(ctx, "rec-thick", "carve-aaaa") }, "lvremove", true},
		{"rename", func(ctx context.Context, c *Client) error {
			return c.RenameLV(ctx, "rec-thick", "carve-aaaa", "carve-bbbb")
		}, "lvrename", true},
		{"deactivate", func(ctx context.Context, c *Client) error { return c.DeactivateLV(ctx, "rec-thick", "plain") }, "lvchange", false},
		{"activate", func(ctx context.Context, c *Client) error {
			_, err := c.ActivateLV(ctx, "rec-thick", "plain")
			return err
		}, "lvchange", false},
	}
}

// runMutation runs tt against a fake lvm and returns the command lines of
// its subcommand.
func runMutation(t *testing.T, tt mutationCase) [][]string {
	t.Helper()
	fixture := "fullreport-thick.json"
	if strings.Contains(tt.name, "thin") {
		fixture = "fullreport-thin.json"
	}
	f := loadFake(t, fixture)
	if err := tt.do(context.Background(), f.client()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, argv := range f.calls {
		if argv[0] == tt.command {
			out = append(out, argv)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s ran: %q", tt.command, f.calls)
	}
	return out
}
