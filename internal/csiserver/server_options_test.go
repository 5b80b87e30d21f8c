package csiserver

import (
	"context"
	"errors"
	"strings"
	"testing"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// TestUnloggedPayloads: a quiet method's request and response reach no log
// line, at any verbosity, and its outcome still does.
func TestUnloggedPayloads(t *testing.T) {
	const method = "/carve.nodeagent.v1.NodeAgent/Enroll"
	tests := []struct {
		name    string
		handler grpc.UnaryHandler
		want    string
	}{
		{"success", func(context.Context, any) (any, error) { return &healthpb.HealthCheckResponse{}, nil }, "GRPC call succeeded"},
		{"failure", func(context.Context, any) (any, error) {
			return nil, status.Error(codes.FailedPrecondition, "no token")
		}, "GRPC call failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(5), ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			req := &healthpb.HealthCheckRequest{Service: "secret-token"}
			resp := func(ctx context.Context, r any) (any, error) {
				out, err := tt.handler(ctx, r)
				if out != nil {
					out = &healthpb.HealthCheckRequest{Service: "secret-response"}
				}
				return out, err
			}
			if _, err := loggingInterceptor(map[string]bool{method: true})(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, resp); (err != nil) != (tt.name == "failure") {
				t.Fatalf("interceptor changed the outcome: %v", err)
			}
			out := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			for _, secret := range []string{"secret-token", "secret-response"} {
				if strings.Contains(out, secret) {
					t.Errorf("%s reached the log:\n%s", secret, out)
				}
			}
			if !strings.Contains(out, tt.want) || !strings.Contains(out, method) {
				t.Errorf("log lacks %q or the method:\n%s", tt.want, out)
			}
		})
	}
}

// fakeStream is a server stream with a context only.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s fakeStream) Context() context.Context     { return s.ctx }
func (s fakeStream) SetHeader(metadata.MD) error  { return nil }
func (s fakeStream) SendHeader(metadata.MD) error { return nil }

func TestStreamLoggingInterceptor(t *testing.T) {
	const method = "/carve.nodeagent.v1.NodeAgent/WatchCapacity"
	tests := []struct {
		name string
		err  error
		want []string
	}{
		{"ended", nil, []string{"GRPC stream opened", "inside", "GRPC stream ended", method}},
		{"failed", status.Error(codes.Unavailable, "gone"), []string{"GRPC stream failed", "Unavailable", "gone"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2), ktesting.BufferLogs(true)))
			ss := fakeStream{ctx: klog.NewContext(context.Background(), logger)}
			err := StreamLoggingInterceptor(nil, ss, &grpc.StreamServerInfo{FullMethod: method}, func(_ any, s grpc.ServerStream) error {
				klog.FromContext(s.Context()).Info("inside")
				return tt.err
			})
			if !errors.Is(err, tt.err) {
				t.Fatalf("interceptor changed the outcome: %v", err)
			}
			out := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("log lacks %q:\n%s", w, out)
				}
			}
			if !strings.Contains(out, `inside method="`+method) {
				t.Errorf("the handler's logger does not carry the method:\n%s", out)
			}
		})
	}
}

// TestServerOptions: a service added with WithServices is served beside
// the CSI ones, through the same metrics interceptor, with the server
// options passed.
func TestServerOptions(t *testing.T) {
	mm := csimetrics.NewCSIMetricsManagerForPlugin("lvm.carve.dev")
	optionSeen := false
	srv := NewGRPCServer(Services{Identity: NewIdentityServer(IdentityConfig{Name: "lvm.carve.dev", Version: "test"})}, mm,
		WithServices(func(r grpc.ServiceRegistrar) { healthpb.RegisterHealthServer(r, health.NewServer()) }),
		WithGRPCOptions(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
			optionSeen = true
			return status.Error(codes.Unimplemented, "unknown")
		})))
	conn := serveOnSocket(t, srv)
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("the added service: %v", err)
	}
	err := conn.Invoke(t.Context(), "/nothing.V1/Here", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if status.Code(err) != codes.Unimplemented || !optionSeen {
		t.Errorf("the gRPC option was not applied: %v", err)
	}
	n, err := testutil.GatherAndCount(mm.GetRegistry(), "csi_plugin_operations_seconds")
	if err != nil || n != 1 {
		t.Errorf("%d csi_plugin_operations_seconds series (err %v), want 1: the added service's call", n, err)
	}
}
