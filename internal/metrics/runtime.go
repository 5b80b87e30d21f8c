package metrics

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRuntimeRegistry returns a registry with the Go runtime (go_*) and
// process (process_*) collectors and carve_build_info, served beside the
// CSI metrics by both roles: restarts, memory, goroutines and file
// descriptors, and which version runs where.
func NewRuntimeRegistry(version, role string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfo(version, role),
	)
	return reg
}

// newBuildInfo is carve_build_info: always 1, the labels say what runs.
func newBuildInfo(version, role string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "carve_build_info",
		Help: "Always 1; labels name carve's version, the VCS revision it was built from, the Go version and the role (plugin or controller).",
		ConstLabels: prometheus.Labels{
			"version":   version,
			"revision":  vcsRevision(),
			"goversion": runtime.Version(),
			"role":      role,
		},
	})
	g.Set(1)
	return g
}

// vcsRevision is the commit the binary was built from, as the Go toolchain
// stamps it ("unknown" for builds outside a VCS checkout, such as tests).
func vcsRevision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
