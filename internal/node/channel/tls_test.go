package channel

import (
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// TestHandshakes: only the controller's certificate from the trusted CA
// reaches the agent.
func TestHandshakes(t *testing.T) {
	e := newEnv(t)
	addr := e.serve(t)
	asNode, err := e.iss.IssueNode("x")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		creds credentials.TransportCredentials
		want  codes.Code
	}{
		{"the controller", credentials.NewTLS(enrollTLS(mustCtrl(t, e.iss))), codes.OK},
		{"no client certificate", credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13,
			InsecureSkipVerify: true}), codes.Unavailable},
		{"a controller certificate from another CA", credentials.NewTLS(enrollTLS(mustCtrl(t, e.otherIss))), codes.Unavailable},
		{"a node certificate as the client", credentials.NewTLS(enrollTLS(asNode)), codes.Unavailable},
		{"plain TCP", insecure.NewCredentials(), codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := dial(t, addr, tt.creds).Inventory(t.Context(), &nodeagentv1.InventoryRequest{})
			if got := status.Code(err); got != tt.want {
				t.Errorf("Inventory: %v, want code %s", err, tt.want)
			}
		})
	}
}

// TestGarbage: bytes that are no TLS, and a TLS hello cut short, do not
// take the listener down.
func TestGarbage(t *testing.T) {
	e := newEnv(t)
	addr := e.serve(t)
	noise := make([]byte, 4096)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	for _, payload := range [][]byte{
		noise,
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		{0x16, 0x03, 0x01, 0xff, 0xff, 0x01}, // a handshake record announcing more than is sent
		{},
	} {
		var d net.Dialer
		conn, err := d.DialContext(t.Context(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write(payload); err != nil {
			t.Fatal(err)
		}
		if cw, ok := conn.(*net.TCPConn); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, conn) // the server answers with an alert, or closes
		_ = conn.Close()
	}
	if _, err := dial(t, addr, credentials.NewTLS(enrollTLS(mustCtrl(t, e.iss)))).Inventory(t.Context(), &nodeagentv1.InventoryRequest{}); err != nil {
		t.Fatalf("after garbage, the controller is not served: %v", err)
	}
}
