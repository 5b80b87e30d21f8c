//go:build !nodeagent

package main

import (
	"flag"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/controller/castore"
	"github.com/carve-csi/carve/internal/nodeca"
)

func TestControllerOptions(t *testing.T) {
	valid := func() ControllerOptions {
		return ControllerOptions{CommonOptions: CommonOptions{Endpoint: "unix:///csi/csi.sock", DriverName: DefaultDriverName},
			LostNodesInterval: time.Minute, LostNodeGrace: 30 * time.Minute, LeaderElection: true, MoveRetries: 40,
			Audit: AuditOptions{Interval: time.Minute, Grace: 6 * time.Hour, RemovalGrace: 7 * 24 * time.Hour}}
	}
	tests := []struct {
		name string
		mod  func(o *ControllerOptions)
		want string // "" means valid
	}{
		{"defaults", func(*ControllerOptions) {}, ""},
		{"watch off", func(o *ControllerOptions) { o.LostNodesInterval = 0 }, ""},
		{"deleting claims", func(o *ControllerOptions) { o.DeleteClaimsOfLostNodes = true }, ""},
		{"watch too often", func(o *ControllerOptions) { o.LostNodesInterval = time.Millisecond }, "--lost-nodes-interval"},
		{"negative interval", func(o *ControllerOptions) { o.LostNodesInterval = -time.Second }, "--lost-nodes-interval"},
		{"deleting claims without the watch", func(o *ControllerOptions) { o.DeleteClaimsOfLostNodes, o.LostNodesInterval = true, 0 }, "--delete-claims-of-lost-nodes"},
		{"no lost-node grace period", func(o *ControllerOptions) { o.DeleteClaimsOfLostNodes, o.LostNodeGrace = true, 0 }, "--lost-node-grace-period"},
		{"deleting retained claims", func(o *ControllerOptions) { o.DeleteClaimsOfLostNodes, o.DeleteRetainedClaimsOfLostNodes = true, true }, ""},
		{"deleting retained claims alone", func(o *ControllerOptions) { o.DeleteRetainedClaimsOfLostNodes = true }, "--delete-retained-claims-of-lost-nodes: needs --delete-claims-of-lost-nodes"},
		{"no move retries", func(o *ControllerOptions) { o.MoveRetries = 0 }, "--move-retries"},
		{"bad endpoint", func(o *ControllerOptions) { o.Endpoint = "tcp://x:1" }, "--endpoint"},
		{"routing", func(o *ControllerOptions) { o.Route = routing() }, ""},
		{"routing without a namespace", func(o *ControllerOptions) { o.Route = routing(); o.Route.Namespace = "" }, "--node-channel-namespace"},
		{"routing without a capacity namespace", func(o *ControllerOptions) { o.Route = routing(); o.Route.CapacityNamespace = "" }, "--capacity-namespace"},
		{"routing without a port name", func(o *ControllerOptions) { o.Route = routing(); o.Route.PortName = "" }, "--node-channel-port-name"},
		{"routing without the node service account", func(o *ControllerOptions) { o.Route = routing(); o.Route.ServiceAccount = "" }, "--node-service-account"},
		{"routing without an audience", func(o *ControllerOptions) { o.Route = routing(); o.Route.Audience = "" }, "--node-token-audience"},
		{"routing without a CA name", func(o *ControllerOptions) { o.Route = routing(); o.Route.CAName = "" }, "--node-channel-ca"},
		{"a CA too short-lived to rotate", func(o *ControllerOptions) { o.Route = routing(); o.Route.CAValidity = 30 * time.Second }, "--node-channel-ca-validity"},
		{"no propagation", func(o *ControllerOptions) { o.Route = routing(); o.Route.CAPropagation = 0 }, "--node-channel-ca-propagation"},
		{"no routing: its other flags are not read", func(o *ControllerOptions) { o.Route = RouteOptions{} }, ""},
		{"audit off", func(o *ControllerOptions) { o.Audit.Interval = 0 }, ""},
		{"audit too often", func(o *ControllerOptions) { o.Audit.Interval = time.Millisecond }, "--audit-interval"},
		{"negative audit interval", func(o *ControllerOptions) { o.Audit.Interval = -time.Second }, "--audit-interval"},
		{"no grace period", func(o *ControllerOptions) { o.Audit.Grace = 0 }, "--orphan-grace-period"},
		{"no removal grace period", func(o *ControllerOptions) { o.Audit.RemovalGrace = 0 }, "--orphan-removal-grace-period"},
		{"removing orphans", func(o *ControllerOptions) { o.Route = routing(); o.Audit.RemoveOrphans = true }, ""},
		{"removing orphans without the audit", func(o *ControllerOptions) { o.Route = routing(); o.Audit.RemoveOrphans, o.Audit.Interval = true, 0 }, "--remove-orphans"},
		{"removing orphans without the node channel", func(o *ControllerOptions) { o.Audit.RemoveOrphans = true }, "--remove-orphans: needs the node channel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid()
			tt.mod(&o)
			checkValidate(t, o.Validate(), tt.want)
		})
	}
}

// routing is a complete set of the controller's routing flags.
func routing() RouteOptions {
	return RouteOptions{Service: "carve-node", Namespace: "carve-system", CapacityNamespace: "carve-system",
		PortName: "node-channel", ServiceAccount: "carve-node", Audience: "carve-controller", CAName: "carve-node-channel-ca",
		CAValidity: nodeca.DefaultCAValidity, CAPropagation: castore.DefaultPropagation}
}

// TestControllerDeletionDefaults: the deletions carve makes on its own
// wait, by default, long enough for a person to notice and step in.
func TestControllerDeletionDefaults(t *testing.T) {
	var o ControllerOptions
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flag string
		got  any
		want any
	}{
		{"--delete-claims-of-lost-nodes", o.DeleteClaimsOfLostNodes, false},
		{"--lost-node-grace-period", o.LostNodeGrace, 30 * time.Minute},
		{"--delete-retained-claims-of-lost-nodes", o.DeleteRetainedClaimsOfLostNodes, false},
		{"--remove-orphans", o.Audit.RemoveOrphans, false},
		{"--orphan-grace-period", o.Audit.Grace, 6 * time.Hour},
		{"--orphan-removal-grace-period", o.Audit.RemovalGrace, 7 * 24 * time.Hour},
		{"--move-retries", o.MoveRetries, 40},
	} {
		if c.got != c.want {
			t.Errorf("%s defaults to %v, want %v", c.flag, c.got, c.want)
		}
	}
}
