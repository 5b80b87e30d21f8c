package registration

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	driverName = "lvm.carve.dev"
	csiSocket  = "/var/lib/kubelet/plugins/lvm.carve.dev/csi.sock"
)

// running is a Server under test with its registry and log.
type running struct {
	srv  *Server
	reg  *prometheus.Registry
	logs func() string
	stop func() error // cancels Run and returns its error
}

// start runs a Server on dir until the test ends (or stop is called).
func start(t *testing.T, dir string, mod func(*Config)) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Dir: dir, DriverName: driverName, CSISocket: csiSocket, Metrics: NewMetrics(reg), RetryDelay: time.Hour, CheckInterval: time.Hour}
	if mod != nil {
		mod(&cfg)
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	srv := New(cfg)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var result error
	stopped := false
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10 s of the cancel")
			}
		}
		return result
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return &running{srv: srv, reg: reg, stop: stop,
		logs: func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }}
}

// kubelet is a fake kubelet's plugin watcher: it waits for the socket and
// calls the registration API as the kubelet does.
type kubelet struct {
	client registerapi.RegistrationClient
}

// dialKubelet waits for a socket at path and connects to it.
func dialKubelet(t *testing.T, path string) *kubelet {
	t.Helper()
	waitFor(t, "a socket at "+path, func() bool { return isSocket(path) })
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := conn.Close(); err != nil {
			t.Errorf("close the kubelet's connection: %v", err)
		}
	})
	return &kubelet{client: registerapi.NewRegistrationClient(conn)}
}

func (k *kubelet) getInfo(t *testing.T) *registerapi.PluginInfo {
	t.Helper()
	// The kubelet dials until connected (10 s; a socket file can exist
	// a moment before it listens), then gives GetInfo one second.
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Second)
	defer cancel()
	info, err := k.client.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	return info
}

func (k *kubelet) notify(t *testing.T, registered bool, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := k.client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: registered, Error: reason}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
}

func isSocket(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stateMetric reads carve_kubelet_registration by state.
func stateMetric(t *testing.T, reg *prometheus.Registry) map[State]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[State]float64{}
	for _, f := range fams {
		if f.GetName() != "carve_kubelet_registration" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" {
					out[State(l.GetValue())] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// oneHot is the metric with st current.
func oneHot(st State) map[State]float64 {
	m := map[State]float64{}
	for _, s := range States {
		m[s] = 0
	}
	m[st] = 1
	return m
}

func equalStates(a, b map[State]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestKubeletRegisters: a fake kubelet finds the socket, reads the plugin
// info and reports; the state, the metric and the log follow the reports,
// and the socket goes when Run ends.
func TestKubeletRegisters(t *testing.T) {
	type report struct {
		registered bool
		reason     string
	}
	tests := []struct {
		name    string
		reports []report
		want    State
		wantLog []string
	}{
		{name: "no report yet", want: StateWaiting},
		{name: "registered", reports: []report{{true, ""}}, want: StateRegistered, wantLog: []string{"The kubelet registered carve"}},
		{name: "registered again (periodic re-registration)", reports: []report{{true, ""}, {true, ""}}, want: StateRegistered},
		{name: "refused with the kubelet's reason", reports: []report{{false, "plugin validation failed: highest supported version 0.3.0"}}, want: StateFailed,
			wantLog: []string{"The kubelet could not register carve", "plugin validation failed: highest supported version 0.3.0"}},
		{name: "refused without a reason", reports: []report{{false, ""}}, want: StateFailed, wantLog: []string{"the kubelet gave no reason"}},
		{name: "refused, then registered", reports: []report{{false, "NodeGetInfo failed"}, {true, ""}}, want: StateRegistered,
			wantLog: []string{"NodeGetInfo failed", "The kubelet registered carve"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			r := start(t, dir, nil)
			sock := filepath.Join(dir, "lvm.carve.dev-reg.sock")
			if r.srv.SocketPath() != sock {
				t.Errorf("SocketPath %q, want %q", r.srv.SocketPath(), sock)
			}
			k := dialKubelet(t, sock)
			info := k.getInfo(t)
			if info.GetType() != registerapi.CSIPlugin || info.GetName() != driverName || info.GetEndpoint() != csiSocket ||
				!slices.Equal(info.GetSupportedVersions(), []string{"1.0.0"}) {
				t.Errorf("GetInfo = %+v, want a CSIPlugin %s at %s supporting 1.0.0", info, driverName, csiSocket)
			}
			for _, rep := range tc.reports {
				k.notify(t, rep.registered, rep.reason)
			}
			if got := r.srv.State(); got != tc.want {
				t.Errorf("State %q, want %q", got, tc.want)
			}
			if got := stateMetric(t, r.reg); !equalStates(got, oneHot(tc.want)) {
				t.Errorf("carve_kubelet_registration %v, want %v", got, oneHot(tc.want))
			}
			if err := r.stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
			if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the socket is still there after Run ended (%v): the kubelet would not deregister", err)
			}
			logs := r.logs()
			for _, w := range tc.wantLog {
				if !strings.Contains(logs, w) {
					t.Errorf("the log lacks %q:\n%s", w, logs)
				}
			}
			if n := strings.Count(logs, "The kubelet registered carve"); n > 1 {
				t.Errorf("a repeated success was logged %d times at the default level:\n%s", n, logs)
			}
		})
	}
}

// TestStart: what Run finds at the socket's path and in the directory.
func TestStart(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir, sock string) string // returns the directory to use
		wantErr string                                      // "" means Run serves
	}{
		{name: "empty directory", prepare: func(_ *testing.T, dir, _ string) string { return dir }},
		{name: "stale socket of an earlier run replaced", prepare: func(t *testing.T, dir, sock string) string {
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			// As a killed process leaves it: the file stays, nobody listens.
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{name: "a regular file is not removed", prepare: func(t *testing.T, dir, sock string) string {
			if err := os.WriteFile(sock, []byte("mine"), 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}, wantErr: "exists and is not a socket"},
		{name: "missing directory", prepare: func(_ *testing.T, dir, _ string) string { return filepath.Join(dir, "nope") },
			wantErr: "kubelet registration directory"},
		{name: "directory is a file", prepare: func(t *testing.T, dir, _ string) string {
			f := filepath.Join(dir, "file")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return f
		}, wantErr: "is not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			sock := SocketPath(base, driverName)
			dir := tc.prepare(t, base, sock)
			if tc.wantErr != "" {
				srv := New(Config{Dir: dir, DriverName: driverName, CSISocket: csiSocket})
				err := srv.Run(context.Background())
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Run = %v, want an error about %q", err, tc.wantErr)
				}
				if data, err := os.ReadFile(sock); tc.name == "a regular file is not removed" && (err != nil || string(data) != "mine") {
					t.Errorf("the file at the socket's path was touched: %q, %v", data, err)
				}
				return
			}
			var before os.FileInfo // the stale file, if any
			if fi, err := os.Lstat(sock); err == nil {
				before = fi
			}
			r := start(t, dir, nil)
			// Not the stale socket: the kubelet would be refused there.
			waitFor(t, "carve's socket", func() bool {
				fi, err := os.Lstat(sock)
				return err == nil && (before == nil || !sameFile(fi, before))
			})
			if info := dialKubelet(t, sock).getInfo(t); info.GetName() != driverName {
				t.Errorf("GetInfo name %q", info.GetName())
			}
			if err := r.stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

// inode identifies the file at path.
func inode(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// TestRefusedRegistrationMakesSocketAnew: after the kubelet refused, the
// socket is made anew (a new file, which makes the kubelet try again) and
// the state goes back to waiting.
func TestRefusedRegistrationMakesSocketAnew(t *testing.T) {
	dir := t.TempDir()
	r := start(t, dir, func(c *Config) { c.RetryDelay = 10 * time.Millisecond })
	sock := r.srv.SocketPath()
	k := dialKubelet(t, sock)
	first := inode(t, sock)
	k.notify(t, false, "csi handler: NodeGetInfo failed")
	waitFor(t, "new socket file", func() bool {
		fi, err := os.Lstat(sock)
		return err == nil && !sameFile(fi, first)
	})
	waitFor(t, "waiting state", func() bool { return r.srv.State() == StateWaiting })
	k2 := dialKubelet(t, sock)
	k2.notify(t, true, "")
	if got := r.srv.State(); got != StateRegistered {
		t.Errorf("State %q after the retry was registered", got)
	}
	if logs := r.logs(); !strings.Contains(logs, "so that the kubelet tries again") {
		t.Errorf("the log does not say why the socket was made anew:\n%s", logs)
	}
}

// TestRetryDelayDoubles: refusals in a row wait longer, up to the cap; a
// success starts again from the configured delay.
func TestRetryDelayDoubles(t *testing.T) {
	s := New(Config{Dir: t.TempDir(), DriverName: driverName, RetryDelay: time.Minute})
	var got []time.Duration
	for range 5 {
		s.setState(StateFailed)
		got = append(got, s.retryDelay())
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, maxRetryDelay, maxRetryDelay}
	if !slices.Equal(got, want) {
		t.Errorf("delays %v, want %v", got, want)
	}
	s.setState(StateRegistered)
	s.setState(StateFailed)
	if d := s.retryDelay(); d != time.Minute {
		t.Errorf("delay after a success and one refusal: %v, want 1m", d)
	}
}

// TestSocketCheck: a socket file removed by someone else (a cleaned
// directory) comes back at the next check; a socket that another process
// put in its place is left alone, also at shutdown.
func TestSocketCheck(t *testing.T) {
	t.Run("removed socket made anew", func(t *testing.T) {
		r := start(t, t.TempDir(), func(c *Config) { c.CheckInterval = 10 * time.Millisecond })
		sock := r.srv.SocketPath()
		dialKubelet(t, sock).getInfo(t) // serving: the socket is recorded
		if err := os.Remove(sock); err != nil {
			t.Fatal(err)
		}
		if info := dialKubelet(t, sock).getInfo(t); info.GetName() != driverName {
			t.Errorf("GetInfo after the socket came back: %+v", info)
		}
		if logs := r.logs(); !strings.Contains(logs, "the socket file was removed") {
			t.Errorf("the log does not say why the socket was made anew:\n%s", logs)
		}
	})
	t.Run("another process's socket left alone", func(t *testing.T) {
		dir := t.TempDir()
		r := start(t, dir, func(c *Config) { c.CheckInterval = 10 * time.Millisecond })
		sock := r.srv.SocketPath()
		dialKubelet(t, sock).getInfo(t) // serving: the socket is recorded
		// Made elsewhere and renamed over carve's, so the path is never
		// empty for the check to fill.
		tmp := filepath.Join(dir, "other.sock")
		other, err := net.Listen("unix", tmp)
		if err != nil {
			t.Fatal(err)
		}
		other.(*net.UnixListener).SetUnlinkOnClose(false)
		defer func() {
			if err := other.Close(); err != nil {
				t.Error(err)
			}
		}()
		if err := os.Rename(tmp, sock); err != nil {
			t.Fatal(err)
		}
		theirs := inode(t, sock)
		waitFor(t, "log of the foreign socket", func() bool { return strings.Contains(r.logs(), "Another file took") })
		time.Sleep(50 * time.Millisecond) // a few more checks
		if err := r.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
		if fi, err := os.Lstat(sock); err != nil || !sameFile(fi, theirs) {
			t.Errorf("the other process's socket was removed or replaced (%v)", err)
		}
		if n := strings.Count(r.logs(), "Another file took"); n != 1 {
			t.Errorf("the foreign socket was logged %d times, want once:\n%s", n, r.logs())
		}
	})
}

func TestMetricsSet(t *testing.T) {
	var nilMetrics *Metrics
	nilMetrics.Set(StateRegistered) // records nothing, does not panic
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for _, st := range States {
		m.Set(st)
		if got := stateMetric(t, reg); !equalStates(got, oneHot(st)) {
			t.Errorf("after Set(%s): %v", st, got)
		}
	}
	if n := testutil.CollectAndCount(m.state); n != len(States) {
		t.Errorf("%d series, want one per state (%d)", n, len(States))
	}
}
