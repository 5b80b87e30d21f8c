package driver

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
}

// NewGRPCServer returns a gRPC server with the services registered and the
// logging and (when m is not nil) metrics interceptors installed. The
// metrics interceptor runs outermost so it times the whole call.
func NewGRPCServer(svc Services, m csimetrics.CSIMetricsManager) *grpc.Server {
	var chain []grpc.UnaryServerInterceptor
	if m != nil {
		chain = append(chain, MetricsInterceptor(m))
	}
	chain = append(chain, LoggingInterceptor)
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(chain...))
	if svc.Identity != nil {
		csi.RegisterIdentityServer(s, svc.Identity)
	}
	if svc.Controller != nil {
		csi.RegisterControllerServer(s, svc.Controller)
	}
	if svc.Node != nil {
		csi.RegisterNodeServer(s, svc.Node)
	}
	return s
}

// ParseEndpoint returns the socket path of a unix:// endpoint
// ("unix:///csi/csi.sock" or "unix:/csi/csi.sock").
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
		// unix://relative/path: keep what the user wrote.
		p = filepath.Join(u.Host, u.Path)
	}
	if p == "" {
		return "", fmt.Errorf("endpoint %q: no socket path", endpoint)
	}
	return p, nil
}

// Listen opens the unix socket of endpoint, removing a stale socket file
// left by a previous run (but nothing that is not a socket).
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
