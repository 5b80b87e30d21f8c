package nodeca

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestGRPC runs the configs through gRPC's own TLS credentials (which add
// the h2 protocol) to a health server standing in for the node agent.
func TestGRPC(t *testing.T) {
	e := newEnv(t)
	now := base.Add(time.Hour)
	pool := NewPool(e.ca.Cert)
	srvCfg := serverConfig(t, mustNode(t, e.iss, "node-a"), pool, now)

	addr := serveHealth(t, grpc.Creds(credentials.NewTLS(srvCfg)))

	ctrl := mustCtrl(t, e.iss)
	tests := []struct {
		name     string
		creds    credentials.TransportCredentials
		wantCode codes.Code
	}{
		{"controller to node-a", credentials.NewTLS(clientConfig(t, ctrl, pool, now, "node-a")), codes.OK},
		{"controller expecting node-b", credentials.NewTLS(clientConfig(t, ctrl, pool, now, "node-b")), codes.Unavailable},
		{"node-b as the caller", credentials.NewTLS(clientConfig(t, mustNode(t, e.iss, "node-b"), pool, now, "node-a")), codes.Unavailable},
		{"plaintext", insecure.NewCredentials(), codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkHealth(t, addr, tt.creds); status.Code(err) != tt.wantCode {
				t.Errorf("Check: %v, want code %s", err, tt.wantCode)
			}
		})
	}
}

// serveHealth serves gRPC's health service, standing in for an agent's
// services, on a local port with opts until the test ends; it returns the
// address.
func serveHealth(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// checkHealth dials addr with creds and returns the health check's error.
func checkHealth(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	return err
}
