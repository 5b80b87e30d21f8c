package csiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/metrics"
)

// TestLoggingInterceptorStripsSecrets: neither the request log (V5) nor the
// failure log (always) shows a secret's value.
func TestLoggingInterceptorStripsSecrets(t *testing.T) {
	tests := []struct {
		name    string
		handler grpc.UnaryHandler
		want    []string
	}{
		{"success", func(ctx context.Context, req any) (any, error) {
			klog.FromContext(ctx).Info("inside")
			return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vg/carve-1"}}, nil
		}, []string{"GRPC call", "GRPC call succeeded", "GRPC response", "vg/carve-1", "inside", "/csi.v1.Controller/CreateVolume"}},
		{"failure", func(ctx context.Context, req any) (any, error) {
			return nil, status.Error(codes.ResourceExhausted, "full")
		}, []string{"GRPC call failed", "ResourceExhausted", "full"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(5), ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			req := &csi.CreateVolumeRequest{Name: "pvc-1", Secrets: map[string]string{"password": "hunter2"}}
			info := &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/CreateVolume"}
			if _, err := LoggingInterceptor(ctx, req, info, tt.handler); (err != nil) != (tt.name == "failure") {
				t.Fatalf("interceptor changed the outcome: %v", err)
			}
			out := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if strings.Contains(out, "hunter2") {
				t.Errorf("a secret reached the log:\n%s", out)
			}
			if !strings.Contains(out, "***stripped***") || !strings.Contains(out, "pvc-1") {
				t.Errorf("the request was not logged with its secrets stripped:\n%s", out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("log lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestLoggingInterceptorLevels: a failure is logged as an error, but a
// NotFound answer to ValidateVolumeCapabilities (carve controller asking
// every node whether it has a volume) only at verbosity 2.
func TestLoggingInterceptorLevels(t *testing.T) {
	tests := []struct {
		name, method string
		code         codes.Code
		wantError    bool
	}{
		{"probe answered NotFound", "/csi.v1.Controller/ValidateVolumeCapabilities", codes.NotFound, false},
		{"probe failed otherwise", "/csi.v1.Controller/ValidateVolumeCapabilities", codes.Internal, true},
		{"NotFound of another call", "/csi.v1.Node/NodeStageVolume", codes.NotFound, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, v := range []int{0, 2} {
				logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(v), ktesting.BufferLogs(true)))
				ctx := klog.NewContext(context.Background(), logger)
				_, err := LoggingInterceptor(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "vg/carve-1"},
					&grpc.UnaryServerInfo{FullMethod: tt.method}, func(context.Context, any) (any, error) {
						return nil, status.Error(tt.code, "volume vg/carve-1 does not exist")
					})
				if status.Code(err) != tt.code {
					t.Fatalf("interceptor changed the answer: %v", err)
				}
				out := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
				if got := strings.Contains(out, "ERROR"); got != tt.wantError {
					t.Errorf("verbosity %d: logged as an error: %v, want %v:\n%s", v, got, tt.wantError, out)
				}
				if logged := strings.Contains(out, "vg/carve-1 does not exist"); logged != (tt.wantError || v >= 2) {
					t.Errorf("verbosity %d: answer logged: %v:\n%s", v, logged, out)
				}
			}
		})
	}
}

// TestServerMetrics runs the gRPC server on a unix socket with both
// interceptors and checks csi_plugin_operations_seconds per method and code.
func TestServerMetrics(t *testing.T) {
	mm := csimetrics.NewCSIMetricsManagerForPlugin("lvm.carve.dev")
	srv := NewGRPCServer(Services{
		Identity:   NewIdentityServer(IdentityConfig{Name: "lvm.carve.dev", Version: "test", Topology: true}),
		Controller: namedVolumes{},
	}, mm)
	conn := serveOnSocket(t, srv)
	ctx := context.Background()
	if _, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	cc := csi.NewControllerClient(conn)
	if _, err := cc.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1"}); err != nil {
		t.Fatal(err)
	}
	_, err := cc.CreateVolume(ctx, &csi.CreateVolumeRequest{})
	csitest.WantCode(t, err, codes.InvalidArgument)
	// Node is not registered on this server.
	_, err = csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	csitest.WantCode(t, err, codes.Unimplemented)

	want := map[string]int{
		`driver_name="lvm.carve.dev",grpc_status_code="OK",method_name="/csi.v1.Identity/GetPluginInfo"`:               1,
		`driver_name="lvm.carve.dev",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume"`:              1,
		`driver_name="lvm.carve.dev",grpc_status_code="InvalidArgument",method_name="/csi.v1.Controller/CreateVolume"`: 1,
	}
	n, err := testutil.GatherAndCount(mm.GetRegistry(), "csi_plugin_operations_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if n != len(want) {
		t.Errorf("%d csi_plugin_operations_seconds series, want %d", n, len(want))
	}
	families, err := mm.GetRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, f := range families {
		if f.GetName() != "csi_plugin_operations_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			got[strings.Join(labels, ",")] = int(m.GetHistogram().GetSampleCount())
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("series {%s} count %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in, want string
		err      bool
	}{
		{"unix:///csi/csi.sock", "/csi/csi.sock", false},
		{"unix:/csi/csi.sock", "/csi/csi.sock", false},
		{"unix://csi.sock", "csi.sock", false},
		{"tcp://127.0.0.1:10000", "", true},
		{"/csi/csi.sock", "", true},
		{"unix://", "", true},
	}
	for _, tt := range tests {
		got, err := ParseEndpoint(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseEndpoint(%q) = %q, %v", tt.in, got, err)
		}
	}
}

func TestListenReplacesStaleSocketOnly(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	l, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	// A second listener replaces the socket file (as after a crash).
	l2, err := Listen("unix://" + sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	for _, l := range []net.Listener{l, l2} {
		if err := l.Close(); err != nil {
			t.Errorf("close listener: %v", err)
		}
	}
	if _, err := Listen("unix://" + dir); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen on a directory: %v", err)
	}
}

// resultCases are errors a CSI call may end with and the result label of
// each: the name of its gRPC code.
var resultCases = []struct {
	err  error
	want string
}{
	{nil, "OK"},
	{status.Error(codes.ResourceExhausted, "full"), "ResourceExhausted"},
	{fmt.Errorf("wrapped: %w", status.Error(codes.NotFound, "gone")), "NotFound"},
	{errors.New("plain"), "Internal"},
}

// TestResultOf: the phase metrics' result label is the gRPC code's name.
func TestResultOf(t *testing.T) {
	for _, tc := range resultCases {
		if got := ResultOf(tc.err); got != tc.want {
			t.Errorf("ResultOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestObservePhaseLabelsResultWithGRPCCode: a phase timed with a metrics.Op
// that ResultOf labels records the gRPC code of the error it ends with.
func TestObservePhaseLabelsResultWithGRPCCode(t *testing.T) {
	for _, tc := range resultCases {
		reg := prometheus.NewRegistry()
		op := metrics.NewRecorder(reg).Begin(metrics.PhaseCreate, ResultOf)
		op.SetClass("fast")
		err := tc.err
		op.End(&err)
		fams, gerr := reg.Gather()
		if gerr != nil {
			t.Fatal(gerr)
		}
		var results []string
		for _, f := range fams {
			if f.GetName() != "carve_phase_duration_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" {
						results = append(results, l.GetValue())
					}
				}
			}
		}
		if len(results) != 1 || results[0] != tc.want {
			t.Errorf("err %v: phase results %v, want [%s]", tc.err, results, tc.want)
		}
	}
}

// namedVolumes is a Controller whose CreateVolume wants a name.
type namedVolumes struct {
	csi.UnimplementedControllerServer
}

func (namedVolumes) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name: must be set")
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vg/" + req.GetName()}}, nil
}

// serveOnSocket serves srv on a unix socket until the test ends and
// returns a client connection to it.
func serveOnSocket(t *testing.T, srv *grpc.Server) *grpc.ClientConn {
	t.Helper()
	endpoint := "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	l, err := Listen(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := conn.Close(); err != nil {
			t.Errorf("close client connection: %v", err)
		}
	})
	return conn
}
