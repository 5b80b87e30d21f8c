package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// kubeletProxy is the HTTP CONNECT proxy the apiserver's egress selector
// uses to reach kubelets. A guest node's kubelet is reachable from the host
// only at a forwarded loopback port, while the apiserver dials the node's
// InternalIP: the proxy maps one to the other. Nothing else is reachable
// through it.
type kubeletProxy struct {
	listener net.Listener

	mu      sync.Mutex
	targets map[string]string // node IP:port -> loopback host:port
}

// startKubeletProxy listens on the unix socket path.
func startKubeletProxy(path string) (*kubeletProxy, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("kubelet proxy: %w", err)
	}
	p := &kubeletProxy{listener: l, targets: map[string]string{}}
	go p.serve()
	return p, nil
}

// route makes the proxy connect requests for nodeAddr to hostAddr.
func (p *kubeletProxy) route(nodeAddr, hostAddr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.targets[nodeAddr] = hostAddr
}

func (p *kubeletProxy) close() error { return p.listener.Close() }

func (p *kubeletProxy) serve() {
	for {
		c, err := p.listener.Accept()
		if err != nil {
			return // closed
		}
		go p.handle(c)
	}
}

func (p *kubeletProxy) handle(c net.Conn) {
	defer c.Close() //nolint:errcheck // the tunnel is over either way
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return
	}
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	p.mu.Lock()
	target, ok := p.targets[req.Host]
	p.mu.Unlock()
	if req.Method != http.MethodConnect || !ok {
		klog.InfoS("Kubelet proxy refused a request", "method", req.Method, "host", req.Host)
		fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n") //nolint:errcheck // closing anyway
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := (&net.Dialer{}).DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n") //nolint:errcheck // closing anyway
		return
	}
	defer up.Close() //nolint:errcheck // the tunnel is over either way
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after its request are in br's buffer.
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, br); closeWrite(up); done <- struct{}{} }() //nolint:errcheck // a broken tunnel ends both ways
	go func() { io.Copy(c, up); closeWrite(c); done <- struct{}{} }()   //nolint:errcheck // a broken tunnel ends both ways
	<-done
	<-done
}

// closeWrite half-closes a connection so the other side sees the end.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite() //nolint:errcheck // best effort; Close follows
	}
}
