package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/version"
)

// newMetricsManager is a role's CSI metrics manager; /metrics adds the Go
// runtime and process collectors and carve_build_info. csi-lib-utils' own
// process_start_time_seconds is left out: the process collector has it.
func newMetricsManager(driverName, role string) csimetrics.CSIMetricsManager {
	mm := csimetrics.NewCSIMetricsManagerWithOptions(driverName,
		csimetrics.WithSubsystem(csimetrics.SubsystemPlugin),
		csimetrics.WithProcessStartTime(false))
	return mm.WithAdditionalRegistry(metrics.NewRuntimeRegistry(version.Version, role))
}

// serveMetrics serves /metrics, /healthz and /readyz until ctx ends.
func serveMetrics(ctx context.Context, addr string, mm csimetrics.CSIMetricsManager, ready func(context.Context) error) (<-chan error, error) {
	mux := http.NewServeMux()
	mm.RegisterToServer(mux, "/metrics")
	addHealth(mux, ready)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(l)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	go func() {
		<-ctx.Done()
		// ctx has ended: the shutdown gets its own bound, keeping ctx's values.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			klog.ErrorS(err, "Stopping the metrics server")
		}
	}()
	klog.InfoS("Serving metrics", "address", l.Addr().String())
	return done, nil
}

// addHealth adds the kubelet's probes: /healthz answers 200 while the
// process serves, so a missing volume group does not restart the pod in a
// loop; /readyz answers 503 with reason codes only (vgview.Reasons), since
// anyone reaching the pod IP may ask and LVM's text names disks and paths.
func addHealth(mux *http.ServeMux, ready func(context.Context) error) {
	var last notReadyLog
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { answerHealth(w, nil) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		err := ready(r.Context())
		last.log(err)
		answerHealth(w, err)
	})
}

// notReadyLog logs why the node is not ready when that changes.
type notReadyLog struct {
	mu   sync.Mutex
	last string
}

func (l *notReadyLog) log(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	l.mu.Lock()
	changed := msg != l.last
	l.last = msg
	l.mu.Unlock()
	switch {
	case !changed:
	case err != nil:
		klog.InfoS("Not ready", "reasons", vgview.Reasons(err), "err", err)
	default:
		klog.InfoS("Ready")
	}
}

func answerHealth(w http.ResponseWriter, err error) {
	if err != nil {
		http.Error(w, "not ready: "+strings.Join(vgview.Reasons(err), " "), http.StatusServiceUnavailable)
		return
	}
	if _, err := io.WriteString(w, "ok\n"); err != nil {
		klog.V(4).InfoS("Writing a health answer failed", "err", err)
	}
}

// serveGRPC serves s on l until ctx ends, then stops gracefully (10 s).
func serveGRPC(ctx context.Context, s *grpc.Server, l net.Listener) error {
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	klog.InfoS("Stopping: finishing in-flight CSI calls")
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		s.Stop()
	}
	return nil
}
