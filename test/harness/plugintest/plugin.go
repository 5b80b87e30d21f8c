// Package plugintest runs a real `carve node` (or `carve controller`)
// process for the root test tiers: it writes the device-class file, starts
// the binary with its documented command line, waits until Probe answers
// ready over the unix socket, and scrapes the process's /metrics. It
// drives the binary from the outside, exactly as a kubelet and the
// sidecars would, so nothing here reaches into carve's packages.
package plugintest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Options describe one plugin process.
type Options struct {
	// Binary is the path of the carve binary.
	Binary string
	// Dir holds the config file and the socket. It must be on a local
	// filesystem (a tmpfs is fine): unix sockets do not work on 9p.
	Dir string
	// NodeName is passed as --node-name.
	NodeName string
	// Config is the YAML text of the device-class file.
	Config string
	// MaxVolumes is passed as --max-volumes when > 0.
	MaxVolumes int
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
	// Env is added to the process environment (the guest needs
	// DM_DISABLE_UDEV=1 for LVM to make its device nodes itself).
	Env []string
	// Log receives the plugin's stdout and stderr; nil discards them.
	Log io.Writer
	// ReadyTimeout bounds the wait for Probe; 0 means two minutes (the
	// guest runs Go code about 28 times slower than the host).
	ReadyTimeout time.Duration
	// NotReadyOK makes Start return once Probe answers at all, ready or
	// not: for a plugin that serves without its volume groups.
	NotReadyOK bool
	// OwnProcessGroup starts the plugin in a process group of its own
	// (its ID is Pid), so that a test can tell when the commands it
	// started have ended.
	OwnProcessGroup bool
}

// Plugin is a running `carve node` (or `carve controller`) process.
type Plugin struct {
	// Endpoint is the --endpoint value (unix://<socket>).
	Endpoint string
	// MetricsURL is http://<metrics address>/metrics.
	MetricsURL string
	// Conn is a gRPC connection to the plugin's socket.
	Conn *grpc.ClientConn

	cmd  *exec.Cmd
	done chan struct{}
	err  error // the process's exit status, set before done is closed
}

// Start writes the config to opts.Dir/config.yaml and starts the plugin
// (registering with no kubelet: none runs here). It returns once the plugin
// answers Probe with ready (or ready unset; with NotReadyOK, any answer),
// and stops the process again when it does not.
func Start(ctx context.Context, opts Options) (*Plugin, error) {
	if opts.Binary == "" || opts.Dir == "" || opts.NodeName == "" {
		return nil, errors.New("plugintest: Binary, Dir and NodeName are required")
	}
	cfg := filepath.Join(opts.Dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(opts.Config), 0o644); err != nil {
		return nil, fmt.Errorf("plugintest: writing the config: %w", err)
	}
	args := []string{"node",
		"--node-name", opts.NodeName,
		"--config", cfg,
		"--kubelet-registration-dir=",
		// The state directory is Dir (the socket's), which may be a
		// tmpfs (the guest's /tmp): the tests outlive no reboot.
		"--allow-volatile-state-dir",
	}
	if opts.MaxVolumes > 0 {
		args = append(args, "--max-volumes", strconv.Itoa(opts.MaxVolumes))
	}
	return launch(ctx, launchOptions{binary: opts.Binary, sock: filepath.Join(opts.Dir, "csi.sock"),
		args: append(args, opts.ExtraArgs...), env: opts.Env, log: opts.Log,
		readyTimeout: opts.ReadyTimeout, notReadyOK: opts.NotReadyOK, ownGroup: opts.OwnProcessGroup})
}

// ControllerOptions describe one `carve controller` process.
type ControllerOptions struct {
	// Binary is the path of the carve binary.
	Binary string
	// Dir holds the socket (controller.sock, so that a plugin can share
	// the directory); a local filesystem, as for Options.Dir.
	Dir string
	// Kubeconfig is passed as --kubeconfig, which turns on the watch for
	// the volumes of deleted Nodes (under leader election unless
	// ExtraArgs say otherwise); empty runs the controller with
	// --lost-nodes-interval=0 (no API server here).
	Kubeconfig string
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
	// Env is added to the process environment.
	Env []string
	// Log receives the controller's stdout and stderr; nil discards them.
	Log io.Writer
	// ReadyTimeout bounds the wait for Probe; 0 means two minutes.
	ReadyTimeout time.Duration
}

// StartController starts `carve controller` with its documented command
// line and returns once it answers Probe with ready; Plugin's methods
// (Scrape, Stop) serve it as they serve a plugin.
func StartController(ctx context.Context, opts ControllerOptions) (*Plugin, error) {
	if opts.Binary == "" || opts.Dir == "" {
		return nil, errors.New("plugintest: Binary and Dir are required")
	}
	args := []string{"controller"}
	if opts.Kubeconfig != "" {
		args = append(args, "--kubeconfig", opts.Kubeconfig)
	} else {
		args = append(args, "--lost-nodes-interval=0")
	}
	return launch(ctx, launchOptions{binary: opts.Binary, sock: filepath.Join(opts.Dir, "controller.sock"),
		args: append(args, opts.ExtraArgs...), env: opts.Env, log: opts.Log, readyTimeout: opts.ReadyTimeout})
}

// launchOptions are what Start and StartController share: the role's
// arguments, to which launch adds --endpoint and --metrics-address.
type launchOptions struct {
	binary, sock string
	args, env    []string
	log          io.Writer
	readyTimeout time.Duration
	notReadyOK   bool
	ownGroup     bool
}

// launch starts the process and waits until it is ready.
func launch(ctx context.Context, o launchOptions) (*Plugin, error) {
	// A socket left by an earlier process of the same test would make
	// the new one fail to listen, or the probe below reach nothing.
	if err := os.Remove(o.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("plugintest: removing an old socket: %w", err)
	}
	metricsAddr, err := freeLoopbackAddress()
	if err != nil {
		return nil, err
	}
	// The role comes first; its flags after it.
	args := append([]string{o.args[0], "--endpoint", "unix://" + o.sock, "--metrics-address", metricsAddr}, o.args[1:]...)
	// Not CommandContext: the process must outlive the start-up context;
	// Stop ends it.
	cmd := exec.Command(o.binary, args...) //nolint:noctx // see above: Stop ends it
	cmd.Env = append(os.Environ(), o.env...)
	log := o.log
	if log == nil {
		log = io.Discard
	}
	cmd.Stdout, cmd.Stderr = log, log
	if o.ownGroup {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("plugintest: starting %s: %w", o.binary, err)
	}
	p := &Plugin{
		Endpoint:   "unix://" + o.sock,
		MetricsURL: "http://" + metricsAddr + "/metrics",
		cmd:        cmd,
		done:       make(chan struct{}),
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	timeout := o.readyTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	if err := p.waitReady(ctx, o.sock, timeout, o.notReadyOK); err != nil {
		return nil, errors.Join(err, p.Stop(10*time.Second))
	}
	return p, nil
}

// waitReady waits for the socket, dials it and polls Probe until it is
// ready, or until it answers at all with anyAnswer.
func (p *Plugin) waitReady(ctx context.Context, sock string, timeout time.Duration, anyAnswer bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("plugintest: the plugin exited before it was ready: %w", p.err)
		case <-ctx.Done():
			return fmt.Errorf("plugintest: the plugin was not ready after %s: %w", timeout, last)
		case <-tick.C:
		}
		if _, err := os.Stat(sock); err != nil {
			last = err
			continue
		}
		if p.Conn == nil {
			conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return fmt.Errorf("plugintest: dialing %s: %w", sock, err)
			}
			p.Conn = conn
		}
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		rsp, err := csi.NewIdentityClient(p.Conn).Probe(pctx, &csi.ProbeRequest{})
		pcancel()
		if err != nil {
			last = err
			continue
		}
		if anyAnswer || rsp.GetReady() == nil || rsp.GetReady().GetValue() {
			return nil
		}
		last = errors.New("the Probe answer was ready=false")
	}
}

// Stop sends SIGTERM, waits up to grace for the process to end, then kills
// it. It returns the exit error of a process that did not end cleanly on
// SIGTERM (a crash is worth knowing about); calling it again is harmless.
func (p *Plugin) Stop(grace time.Duration) error {
	var connErr error
	if p.Conn != nil {
		if err := p.Conn.Close(); err != nil {
			connErr = fmt.Errorf("plugintest: closing the client connection: %w", err)
		}
		p.Conn = nil
	}
	return errors.Join(connErr, p.stop(grace))
}

// Kill sends SIGKILL, as a crash or an OOM kill ends the plugin, and
// waits for the process to end; no handler runs. Calling it on an ended
// plugin is harmless.
//
// The process is killed before the client connection is closed: a call in
// flight must end with the process, not be cancelled by the client first
// (which the plugin would see and handle).
func (p *Plugin) Kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("plugintest: killing the plugin: %w", err)
	}
	<-p.done
	if p.Conn != nil {
		err := p.Conn.Close()
		p.Conn = nil
		if err != nil {
			return fmt.Errorf("plugintest: closing the client connection: %w", err)
		}
	}
	return nil
}

// stop is Stop for the process.
func (p *Plugin) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.exitErr()
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("plugintest: signalling the plugin: %w", err)
	}
	select {
	case <-p.done:
		return p.exitErr()
	case <-time.After(grace):
		if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("plugintest: killing the plugin %s after SIGTERM: %w", grace, err)
		}
		<-p.done
		return fmt.Errorf("plugintest: the plugin did not stop within %s of SIGTERM", grace)
	}
}

// exitErr is the exit status, treating an exit on SIGTERM itself (no
// handler) like a clean exit.
func (p *Plugin) exitErr() error {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	if p.err != nil {
		return fmt.Errorf("plugintest: the plugin exited: %w", p.err)
	}
	return nil
}

// Pid is the plugin's process ID (with OwnProcessGroup, its process
// group's too).
func (p *Plugin) Pid() int { return p.cmd.Process.Pid }

// Exited tells whether the process has ended.
func (p *Plugin) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// freeLoopbackAddress returns a 127.0.0.1 address with a port that was free
// a moment ago: the plugin takes --metrics-address as host:port and the test
// must know where to scrape.
func freeLoopbackAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("plugintest: finding a free port (is the loopback interface up?): %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", err
	}
	return addr, nil
}
