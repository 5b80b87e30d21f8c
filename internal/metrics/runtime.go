package metrics

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRuntimeRegistry returns a registry with the Go and process collectors and
// carve_build_info.
func NewRuntimeRegistry(version, role string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfo(version, role),
	)
	return reg
}

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

// vcsRevision is the commit the toolchain stamped, or "unknown".
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
