// Package registration registers carve with the kubelet as
// node-driver-registrar would: it serves <dir>/<driver>-reg.sock in
// plugins_registry. Removing the socket deregisters the driver.
package registration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// supportedVersions are the CSI versions carve offers the kubelet.
var supportedVersions = []string{"1.0.0"}

const (
	defaultCheckInterval = 30 * time.Second
	defaultRetryDelay    = 10 * time.Second
	maxRetryDelay        = 5 * time.Minute
)

// SocketPath is driver's registration socket in dir.
func SocketPath(dir, driver string) string {
	return filepath.Join(dir, driver+"-reg.sock")
}

// Config says what carve tells the kubelet and where.
type Config struct {
	// Dir is the host's plugins_registry as mounted; the kubelet makes it.
	Dir string
	// DriverName is the CSI driver name; it also names the socket.
	DriverName string
	// CSISocket is carve's CSI socket path on the host.
	CSISocket string
	// Metrics receives the registration state; nil records nothing.
	Metrics *Metrics
	// CheckInterval is how often Run remakes a vanished socket; 0 means 30s.
	CheckInterval time.Duration
	// RetryDelay is the wait before remaking the socket after a refusal, which
	// has the kubelet try again; it doubles per refusal up to 5m. 0 means 10s.
	RetryDelay time.Duration
}

// Server serves the registration socket. Make it with New.
type Server struct {
	cfg     Config
	path    string
	refused chan struct{}
	log     klog.Logger

	mu       sync.Mutex
	state    State
	failures int
}

// New returns a server for cfg; Run starts it.
func New(cfg Config) *Server {
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = defaultCheckInterval
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = defaultRetryDelay
	}
	return &Server{cfg: cfg, path: SocketPath(cfg.Dir, cfg.DriverName), refused: make(chan struct{}, 1), state: StateWaiting}
}

// SocketPath is the registration socket the server makes.
func (s *Server) SocketPath() string { return s.path }

// State is where the registration stands.
func (s *Server) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Run serves the socket until ctx ends, then removes it; it fails only when
// the socket cannot be made at start. A vanished socket is remade at the
// next check, and after a refusal, so that the kubelet tries again.
func (s *Server) Run(ctx context.Context) error {
	s.log = klog.FromContext(ctx).WithValues("socket", s.path)
	if fi, err := os.Stat(s.cfg.Dir); err != nil {
		return fmt.Errorf("kubelet registration directory: %w", err)
	} else if !fi.IsDir() {
		return fmt.Errorf("kubelet registration directory %s is not a directory", s.cfg.Dir)
	}
	sock, err := s.listen()
	if err != nil {
		return err
	}
	defer func() { sock.close() }()
	check := time.NewTicker(s.cfg.CheckInterval)
	defer check.Stop()
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			s.log.Info("Removing the kubelet registration socket")
			return nil
		case <-s.refused:
			if retry == nil {
				d := s.retryDelay()
				s.log.Info("Making the registration socket anew after a delay, so that the kubelet tries again", "delay", d)
				retry = time.After(d)
			}
		case <-retry:
			retry = nil
			if s.State() == StateFailed {
				sock = s.renew(sock, "the kubelet refused the registration")
			}
		case <-check.C:
			if why := sock.lost(); why != "" {
				sock = s.renew(sock, why)
			}
		}
	}
}

func (s *Server) retryDelay() time.Duration {
	s.mu.Lock()
	n := s.failures
	s.mu.Unlock()
	d := s.cfg.RetryDelay
	for i := 1; i < n && d < maxRetryDelay; i++ {
		d *= 2
	}
	return min(d, maxRetryDelay)
}

// renew replaces old; nil when that fails (the next check retries).
func (s *Server) renew(old *socket, why string) *socket {
	s.log.Info("Making the kubelet registration socket anew", "reason", why)
	old.close()
	sock, err := s.listen()
	if err != nil {
		s.log.Error(err, "Making the kubelet registration socket failed; trying again at the next check")
		return nil
	}
	return sock
}

func (s *Server) setState(st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = st
	if st == StateRegistered {
		s.failures = 0
	}
	if st == StateFailed {
		s.failures++
	}
	s.cfg.Metrics.Set(st)
}

// notified logs a repeated success only at high verbosity: recent kubelets
// re-register plugins periodically.
func (s *Server) notified(registered bool, reason string) {
	prev := s.State()
	if !registered {
		s.setState(StateFailed)
		if reason == "" {
			reason = "the kubelet gave no reason"
		}
		s.log.Error(errors.New(reason), "The kubelet could not register carve", "driver", s.cfg.DriverName)
		select {
		case s.refused <- struct{}{}:
		default: // Run is already told
		}
		return
	}
	s.setState(StateRegistered)
	if prev != StateRegistered {
		s.log.Info("The kubelet registered carve", "driver", s.cfg.DriverName, "csiSocket", s.cfg.CSISocket)
	} else {
		s.log.V(4).Info("The kubelet confirmed carve's registration", "driver", s.cfg.DriverName)
	}
}

type socket struct {
	path     string
	file     os.FileInfo
	srv      *grpc.Server
	done     chan struct{} // closed when srv stopped serving
	log      klog.Logger
	replaced bool
}

// listen makes the socket file (replacing a stale socket only) and serves.
func (s *Server) listen() (*socket, error) {
	if err := removeStale(s.log, s.path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", s.path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", s.path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	fi, err := os.Lstat(s.path)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("the socket just made: %w", err), l.Close())
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, handler{s: s})
	sock := &socket{path: s.path, file: fi, srv: srv, done: make(chan struct{}), log: s.log}
	s.setState(StateWaiting)
	go func() {
		defer close(sock.done)
		if err := srv.Serve(l); err != nil {
			s.log.Error(err, "The kubelet registration server stopped")
		}
	}()
	s.log.Info("Serving kubelet plugin registration", "driver", s.cfg.DriverName, "csiSocket", s.cfg.CSISocket)
	return sock, nil
}

// removeStale removes an earlier run's socket; anything else at path is not
// carve's to delete.
func removeStale(log klog.Logger, path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("registration socket %s: %w", path, err)
	case fi.Mode()&os.ModeSocket == 0:
		return fmt.Errorf("registration socket %s exists and is not a socket; not removing it", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the stale registration socket: %w", err)
	}
	log.Info("Removed a stale kubelet registration socket")
	return nil
}

// lost tells why the socket no longer reaches its server; "" when it does
// or when someone else's file is at its path now.
func (k *socket) lost() string {
	if k == nil {
		return "no socket"
	}
	fi, err := os.Lstat(k.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "the socket file was removed"
	case err != nil:
		k.log.Error(err, "Checking the kubelet registration socket failed")
		return ""
	case !sameFile(fi, k.file):
		if !k.replaced {
			k.replaced = true
			k.log.Error(nil, "Another file took the kubelet registration socket's name; leaving it alone")
		}
		return ""
	}
	select {
	case <-k.done:
		return "the registration server stopped"
	default:
		return ""
	}
}

func (k *socket) close() {
	if k == nil {
		return
	}
	if fi, err := os.Lstat(k.path); err == nil && sameFile(fi, k.file) {
		if err := os.Remove(k.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			k.log.Error(err, "Removing the kubelet registration socket failed")
		}
	}
	k.srv.Stop()
	<-k.done
}

// sameFile: a new file often reuses a removed one's inode; the modification
// time tells them apart.
func sameFile(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime())
}

type handler struct {
	registerapi.UnimplementedRegistrationServer
	s *Server
}

// GetInfo implements registerapi.RegistrationServer; recent kubelets call it
// every few seconds, so it logs at high verbosity only.
func (h handler) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	h.s.log.V(5).Info("The kubelet asked for the plugin info")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              h.s.cfg.DriverName,
		Endpoint:          h.s.cfg.CSISocket,
		SupportedVersions: slices.Clone(supportedVersions),
	}, nil
}

// NotifyRegistrationStatus implements registerapi.RegistrationServer.
func (h handler) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	h.s.notified(st.GetPluginRegistered(), st.GetError())
	return &registerapi.RegistrationStatusResponse{}, nil
}

// State is where carve's registration with the kubelet stands.
type State string

// The registration states, the values of the metric's state label.
const (
	// StateDisabled: no registration directory (tests, simulated nodes).
	StateDisabled State = "disabled"
	// StateWaiting: the socket is up; the kubelet has not reported yet.
	StateWaiting State = "waiting"
	// StateRegistered: the kubelet reported that it registered the driver.
	StateRegistered State = "registered"
	// StateFailed: the kubelet reported that it could not register it.
	StateFailed State = "failed"
)

// States are every State, in the order the metric lists them.
var States = []State{StateDisabled, StateWaiting, StateRegistered, StateFailed}

// Metrics is the carve_kubelet_registration gauge, 1 for the current state.
// A nil *Metrics records nothing.
type Metrics struct {
	state *prometheus.GaugeVec
}

// NewMetrics creates the gauge and registers it with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "carve_kubelet_registration",
		Help: "Registration of the plugin with the kubelet: 1 for the current state (disabled, waiting, registered, failed), 0 for the others.",
	}, []string{"state"})}
	reg.MustRegister(m.state)
	return m
}

// Set makes st the current state.
func (m *Metrics) Set(st State) {
	if m == nil {
		return
	}
	for _, s := range States {
		v := 0.0
		if s == st {
			v = 1
		}
		m.state.WithLabelValues(string(s)).Set(v)
	}
}
