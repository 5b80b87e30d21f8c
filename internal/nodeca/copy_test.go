package nodeca

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// TestCopyServerConfig: the copy listener of node-a takes node
// certificates of its CA (and PeerNode names the caller), and refuses the
// controller, another CA's node, an expired node certificate and a client
// dialing the wrong node.
func TestCopyServerConfig(t *testing.T) {
	e := newEnv(t)
	now := base.Add(time.Hour)
	pool := NewPool(e.ca.Cert)
	srvCfg, err := CopyServerConfig(Peer{Cert: NewKeypair(mustNode(t, e.iss, "node-a")), CAs: pool, Now: fixed(now)})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 10)
	addr := serveHealth(t, grpc.Creds(credentials.NewTLS(srvCfg)), grpc.UnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			p, _ := peer.FromContext(ctx)
			info, _ := p.AuthInfo.(credentials.TLSInfo)
			node, err := PeerNode(info.State)
			if err != nil {
				return nil, status.Error(codes.PermissionDenied, err.Error())
			}
			seen <- node
			return h(ctx, req)
		}))

	tests := []struct {
		name     string
		creds    credentials.TransportCredentials
		wantCode codes.Code
		wantNode string
	}{
		{"node-b to node-a", credentials.NewTLS(clientConfig(t, mustNode(t, e.iss, "node-b"), pool, now, "node-a")), codes.OK, "node-b"},
		{"node-b expecting node-c", credentials.NewTLS(clientConfig(t, mustNode(t, e.iss, "node-b"), pool, now, "node-c")), codes.Unavailable, ""},
		{"the controller", credentials.NewTLS(clientConfig(t, mustCtrl(t, e.iss), pool, now, "node-a")), codes.Unavailable, ""},
		{"a node of another CA", credentials.NewTLS(clientConfig(t, mustNode(t, e.otherIss, "node-b"), pool, now, "node-a")), codes.Unavailable, ""},
		{"an expired node certificate", credentials.NewTLS(clientConfig(t, mustNode(t, e.expired, "node-b"), pool, now, "node-a")), codes.Unavailable, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkHealth(t, addr, tt.creds); status.Code(err) != tt.wantCode {
				t.Fatalf("Check: %v, want code %s", err, tt.wantCode)
			}
			if tt.wantNode != "" {
				if got := <-seen; got != tt.wantNode {
					t.Errorf("PeerNode %q, want %q", got, tt.wantNode)
				}
			}
		})
	}
}
