package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/carve-csi/carve/internal/node/registration"
	"github.com/carve-csi/carve/internal/node/vgview"
)

// TestHealthEndpoints: /healthz (liveness) answers 200 whatever the
// volume groups look like, so a node with a missing one is never restarted
// in a loop; /readyz (readiness) answers 503 with the reason codes while
// the view is not ready, and never LVM's text (it answers anyone on the
// pod IP).
func TestHealthEndpoints(t *testing.T) {
	missing := &vgview.NotReadyError{Reason: vgview.ReasonVGMissing, Err: errors.New(`device class fast: volume group "vg-fast" is missing`)}
	hung := &vgview.NotReadyError{Reason: vgview.ReasonLVMTimeout, Err: errors.New("read LVM state: lvm fullreport vg-secret: context deadline exceeded")}
	tests := []struct {
		name     string
		path     string
		ready    error
		wantCode int
		wantBody string
	}{
		{"live and ready", "/healthz", nil, http.StatusOK, "ok\n"},
		{"live while a volume group is missing", "/healthz", missing, http.StatusOK, "ok\n"},
		{"ready", "/readyz", nil, http.StatusOK, "ok\n"},
		{"not ready: the reason code only", "/readyz", missing, http.StatusServiceUnavailable, "not ready: vg-missing\n"},
		{"not ready: lvm timed out", "/readyz", hung, http.StatusServiceUnavailable, "not ready: lvm-timeout\n"},
		{"not ready: two reasons", "/readyz", errors.Join(hung, missing), http.StatusServiceUnavailable, "not ready: lvm-timeout vg-missing\n"},
		{"not ready: an error without a reason", "/readyz", errors.New("/dev/sdb: I/O error"), http.StatusServiceUnavailable, "not ready: not-ready\n"},
		{"unknown path", "/livez", nil, http.StatusNotFound, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			addHealth(mux, func(context.Context) error { return tc.ready })
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, tc.path, nil))
			if rec.Code != tc.wantCode {
				t.Errorf("GET %s: %d, want %d", tc.path, rec.Code, tc.wantCode)
			}
			if tc.wantCode != http.StatusNotFound && rec.Body.String() != tc.wantBody {
				t.Errorf("GET %s: body %q, want %q", tc.path, rec.Body.String(), tc.wantBody)
			}
		})
	}
}

// TestKubeletRegistrationFlags: an empty --kubelet-registration-dir runs
// nothing and shows the registration as disabled; a directory runs the
// registration server.
func TestKubeletRegistrationFlags(t *testing.T) {
	tests := []struct {
		name         string
		dir          string
		wantRunners  int
		wantDisabled bool // the metric says disabled
	}{
		{"disabled", "", 0, true},
		{"enabled", t.TempDir(), 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mm := csimetrics.NewCSIMetricsManagerForPlugin(DefaultDriverName)
			m := registration.NewMetrics(mm.GetRegistry().Registerer())
			o := &NodeOptions{CommonOptions: CommonOptions{DriverName: DefaultDriverName},
				KubeletRegistrationDir: tc.dir, KubeletCSISocket: DefaultKubeletCSISocket}
			runners := kubeletRegistration(o, m)
			if len(runners) != tc.wantRunners {
				t.Fatalf("%d runners, want %d", len(runners), tc.wantRunners)
			}
			want := `
# HELP carve_kubelet_registration Registration of the plugin with the kubelet: 1 for the current state (disabled, waiting, registered, failed), 0 for the others.
# TYPE carve_kubelet_registration gauge
carve_kubelet_registration{state="disabled"} 1
carve_kubelet_registration{state="failed"} 0
carve_kubelet_registration{state="registered"} 0
carve_kubelet_registration{state="waiting"} 0
`
			err := testutil.GatherAndCompare(mm.GetRegistry(), strings.NewReader(want), "carve_kubelet_registration")
			if tc.wantDisabled && err != nil {
				t.Errorf("carve_kubelet_registration: %v", err)
			}
			if tc.wantRunners == 0 {
				return
			}
			// The runner serves until its context ends.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- runners[0](ctx) }()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("registration runner: %v", err)
			}
		})
	}
}

// TestMetricsEndpointServesRuntimeAndCSI: one /metrics has the CSI
// histogram, carve_build_info with the role, and the Go and process
// collectors, and process_start_time_seconds only once (csi-lib-utils'
// copy is left out, so the scrape has no gather error).
func TestMetricsEndpointServesRuntimeAndCSI(t *testing.T) {
	mm := newMetricsManager(DefaultDriverName, "controller")
	mm.RecordMetrics("/csi.v1.Controller/ControllerExpandVolume", nil, 0)
	mux := http.NewServeMux()
	mm.RegisterToServer(mux, "/metrics")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d\n%s", rec.Code, body)
	}
	for _, want := range []string{"csi_plugin_operations_seconds_count{", `carve_build_info{`, `role="controller"`, "go_goroutines ", "process_resident_memory_bytes "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if n := strings.Count(body, "\nprocess_start_time_seconds "); n != 1 {
		t.Errorf("process_start_time_seconds appears %d times, want 1", n)
	}
}
