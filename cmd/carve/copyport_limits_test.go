package main

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/nodeca/nodecatest"
)

// heldCopies is a NodeCopy server whose reads wait until release is
// closed, counting how many are running.
type heldCopies struct {
	nodeagentv1.UnimplementedNodeCopyServer
	running atomic.Int32
	release chan struct{}
}

func (h *heldCopies) ReadVolume(_ *nodeagentv1.ReadVolumeRequest, s grpc.ServerStreamingServer[nodeagentv1.ReadVolumeResponse]) error {
	h.running.Add(1)
	defer h.running.Add(-1)
	select {
	case <-h.release:
	case <-s.Context().Done():
	}
	return status.Error(codes.PermissionDenied, "held")
}

// notServed is how long a connection or stream the limits hold back is
// watched: under the limit both are served in milliseconds, so one still
// waiting then is held back, not slow.
const notServed = time.Second

// ready connects c and tells whether it is ready within wait.
func ready(c *grpc.ClientConn, wait time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c.Connect()
	for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
		if !c.WaitForStateChange(ctx, s) {
			return false
		}
		c.Connect()
	}
	return true
}

// TestCopyPortLimits: what a pod that reaches a node's copy port may hold
// open is bounded. A connection that never finishes its TLS handshake is
// closed after the handshake timeout; past the connection limit a new
// connection is not served until one ends; past the stream limit a new
// copy on a connection waits until one ends.
func TestCopyPortLimits(t *testing.T) {
	_, _, cert := nodecatest.NewControllerIssuer(t)
	lim := copyLimits{handshake: 300 * time.Millisecond, connections: 3, streams: 2}
	if def := copyPortLimits(); def.handshake <= 0 || def.connections <= 0 || def.streams == 0 {
		t.Fatalf("carve runs the copy port without a bound: %+v", def)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	copies := &heldCopies{release: make(chan struct{})}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- serveCopyPort(ctx, l, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert}}, copies, lim)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serving: %v", err)
		}
	})
	addr := l.Addr().String()
	clientTLS := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	dial := func(t *testing.T) *grpc.ClientConn {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	t.Run("a handshake never finished is cut off", func(t *testing.T) {
		raw, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = raw.Close() }()
		// gRPC's own default is 120 s; the test's limit is 300 ms.
		if err := raw.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		_, err = raw.Read(make([]byte, 1))
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("a connection that sent nothing is still open: read %v", err)
		}
	})

	t.Run("connections past the limit wait", func(t *testing.T) {
		// Finished handshakes hold their slots (a connection that has not
		// finished is cut off by the handshake timeout).
		var held []*grpc.ClientConn
		for range lim.connections {
			c := dial(t)
			if !ready(c, 10*time.Second) {
				t.Fatalf("connection %d not served: %v", len(held)+1, c.GetState())
			}
			held = append(held, c)
		}
		extra := dial(t)
		if ready(extra, notServed) {
			t.Fatalf("connection %d served beside %d held", lim.connections+1, lim.connections)
		}
		_ = held[0].Close()
		if !ready(extra, 10*time.Second) {
			t.Fatalf("connection %d not served once one of the %d held ended: %v", lim.connections+1, lim.connections, extra.GetState())
		}
		for _, c := range append(held[1:], extra) {
			_ = c.Close()
		}
	})

	t.Run("streams past the limit wait", func(t *testing.T) {
		conn := dial(t)
		defer func() { _ = conn.Close() }()
		client := nodeagentv1.NewNodeCopyClient(conn)
		read := func(ctx context.Context) error {
			s, err := client.ReadVolume(ctx, &nodeagentv1.ReadVolumeRequest{CopyId: "x"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}
		ended := make(chan error, lim.streams+1)
		for range lim.streams {
			go func() { ended <- read(t.Context()) }()
		}
		deadline := time.Now().Add(10 * time.Second)
		for copies.running.Load() < int32(lim.streams) {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d copies running", copies.running.Load(), lim.streams)
			}
			time.Sleep(10 * time.Millisecond)
		}
		go func() { ended <- read(t.Context()) }()
		time.Sleep(notServed)
		if n := copies.running.Load(); n != int32(lim.streams) {
			t.Fatalf("%d copies running on one connection, want at most %d", n, lim.streams)
		}
		close(copies.release)
		for range lim.streams + 1 {
			select {
			case err := <-ended:
				if status.Code(err) != codes.PermissionDenied {
					t.Errorf("a copy ended with %v, want the server's answer", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the copy held back did not run once the others ended")
			}
		}
	})
}
