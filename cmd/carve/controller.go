package main

import (
	"context"

	"github.com/carve-csi/carve/pkg/driver"
	"github.com/carve-csi/carve/pkg/version"
)

// runController serves the cluster-wide Identity, Controller and the one
// Node call (NodeGetCapabilities) that csi-resizer needs; it touches no LVM.
func runController(ctx context.Context, o *ControllerOptions) error {
	mm := newMetricsManager(o.DriverName, "controller")
	svc := driver.Services{
		Identity:   driver.NewIdentityServer(driver.IdentityConfig{Name: o.DriverName, Version: version.Version}),
		Controller: driver.CentralControllerServer{},
		Node:       driver.CentralNodeServer{},
	}
	return serve(ctx, &o.CommonOptions, svc, mm, func(context.Context) error { return nil }, nil)
}
