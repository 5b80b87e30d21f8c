package csiserver

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// Services are the CSI servers one socket serves; nil ones are left out.
type Services struct {
	Identity   csi.IdentityServer
	Controller csi.ControllerServer
	Node       csi.NodeServer
	// SnapshotMetadata is served by the controller only.
	SnapshotMetadata csi.SnapshotMetadataServer
}

// ServerOption adds to what NewGRPCServer builds.
type ServerOption func(*serverOptions)

type serverOptions struct {
	grpc     []grpc.ServerOption
	register []func(grpc.ServiceRegistrar)
	quiet    map[string]bool
}

// WithGRPCOptions passes options to the gRPC server (TLS credentials, say).
func WithGRPCOptions(opts ...grpc.ServerOption) ServerOption {
	return func(o *serverOptions) { o.grpc = append(o.grpc, opts...) }
}

// WithServices registers more services with the same interceptors.
func WithServices(register func(grpc.ServiceRegistrar)) ServerOption {
	return func(o *serverOptions) { o.register = append(o.register, register) }
}

// WithUnloggedPayloads keeps the named methods' payloads out of every log: credentials
// no csi_secret option marks (the Enroll token).
func WithUnloggedPayloads(fullMethods ...string) ServerOption {
	return func(o *serverOptions) {
		if o.quiet == nil {
			o.quiet = map[string]bool{}
		}
		for _, m := range fullMethods {
			o.quiet[m] = true
		}
	}
}

// NewGRPCServer returns a gRPC server for svc with logging and (m not nil) metrics
// interceptors; streams are logged, not timed.
func NewGRPCServer(svc Services, m csimetrics.CSIMetricsManager, opts ...ServerOption) *grpc.Server {
	var o serverOptions
	for _, opt := range opts {
		opt(&o)
	}
	var chain []grpc.UnaryServerInterceptor
	if m != nil {
		chain = append(chain, MetricsInterceptor(m))
	}
	chain = append(chain, loggingInterceptor(o.quiet))
	s := grpc.NewServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(chain...),
		grpc.ChainStreamInterceptor(StreamLoggingInterceptor)}, o.grpc...)...)
	if svc.Identity != nil {
		csi.RegisterIdentityServer(s, svc.Identity)
	}
	if svc.Controller != nil {
		csi.RegisterControllerServer(s, svc.Controller)
	}
	if svc.Node != nil {
		csi.RegisterNodeServer(s, svc.Node)
	}
	if svc.SnapshotMetadata != nil {
		csi.RegisterSnapshotMetadataServer(s, svc.SnapshotMetadata)
	}
	for _, register := range o.register {
		register(s)
	}
	return s
}

// ParseEndpoint returns the socket path of a unix:// endpoint.
func ParseEndpoint(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "unix" {
		return "", fmt.Errorf("endpoint %q: only unix:// sockets are supported", endpoint)
	}
	p := u.Path
	if u.Host != "" {
		p = filepath.Join(u.Host, u.Path)
	}
	if p == "" {
		return "", fmt.Errorf("endpoint %q: no socket path", endpoint)
	}
	return p, nil
}

// Listen opens endpoint's unix socket, removing a stale socket (and nothing else).
func Listen(endpoint string) (net.Listener, error) {
	path, err := ParseEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("endpoint %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("endpoint %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("endpoint directory: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	klog.InfoS("Listening for CSI calls", "endpoint", path)
	return l, nil
}
