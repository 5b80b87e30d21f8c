//go:build !nodeagent

package main

import (
	"context"
	"flag"
)

const program = "carve"

// controllerRole is carve controller, which carve-node leaves out.
func controllerRole() role {
	return role{summary: "the cluster-wide CSI Controller the sidecars call, routed to the node agents; placement, moves, the audit and the capacity objects",
		flags: func(fs *flag.FlagSet) (func() error, func(context.Context) error) {
			var o ControllerOptions
			o.AddFlags(fs)
			return o.Validate, func(ctx context.Context) error { return runController(ctx, &o) }
		}}
}
