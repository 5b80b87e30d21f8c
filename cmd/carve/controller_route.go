//go:build !nodeagent

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/agents"
	"github.com/carve-csi/carve/internal/controller/capacity"
	"github.com/carve-csi/carve/internal/controller/castore"
	"github.com/carve-csi/carve/internal/controller/kube"
	"github.com/carve-csi/carve/internal/controller/mover"
	"github.com/carve-csi/carve/internal/controller/objects"
	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/internal/controller/volumekey"
	"github.com/carve-csi/carve/internal/nodeca"
	"github.com/carve-csi/carve/internal/topology"
)

// RouteOptions configure the controller's node channel.
type RouteOptions struct {
	// Service is the agents' headless Service; empty turns routing off.
	Service string
	// Namespace holds the Service, the node agents' pods and the CA.
	Namespace string
	// CapacityNamespace holds the CSIStorageCapacity objects.
	CapacityNamespace string
	// PortName is the node channel's port in the Service's EndpointSlices.
	PortName string
	// ServiceAccount is the node agents' service account.
	ServiceAccount string
	// Audience is the audience of the node agents' projected tokens.
	Audience string
	// CAName names the CA's Secret and ConfigMap.
	CAName string
	// VolumeKEK names the KEK Secret (made when absent); empty makes no
	// encrypted volumes.
	VolumeKEK string
	// CAValidity is how long the CAs the controller makes are valid.
	CAValidity time.Duration
	// CAPropagation is the longest a new CA waits for every agent to trust it.
	CAPropagation time.Duration
}

// AddFlags registers the node channel flags on fs.
func (o *RouteOptions) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Service, "node-channel-service", "", "headless Service over the node agents; when set, the controller routes every CSI Controller call to the node agent that owns it over the node channel and writes CSIStorageCapacity objects; empty: off")
	fs.StringVar(&o.Namespace, "node-channel-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the node agents' Service and pods and of the node channel's CA; defaults to $POD_NAMESPACE")
	fs.StringVar(&o.CapacityNamespace, "capacity-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the CSIStorageCapacity objects the controller writes; defaults to $POD_NAMESPACE")
	fs.StringVar(&o.PortName, "node-channel-port-name", "node-channel", "name of the node channel port in the Service's EndpointSlices")
	fs.StringVar(&o.ServiceAccount, "node-service-account", "carve-node", "service account of the node agents; an agent proving another identity is refused")
	fs.StringVar(&o.Audience, "node-token-audience", "carve-controller", "audience of the node agents' projected service-account tokens")
	fs.StringVar(&o.CAName, "node-channel-ca", "carve-node-channel-ca", "name of the Secret (the CA, controller only) and ConfigMap (its certificate, mounted by the node agents) of the node channel")
	fs.StringVar(&o.VolumeKEK, "volume-kek-secret", volumekey.DefaultSecret, "name of the Secret (controller only) holding the key-encryption keys that wrap the keys of encrypted volumes; made when absent; empty: no encrypted volumes")
	fs.DurationVar(&o.CAValidity, "node-channel-ca-validity", nodeca.DefaultCAValidity, "how long the node channel CAs the controller makes are valid; a CA is rotated when a third of its life is left")
	fs.DurationVar(&o.CAPropagation, "node-channel-ca-propagation", castore.DefaultPropagation, "the longest a new node channel CA is trusted beside the old one before it signs, when not every node agent accepts it sooner")
}

// Validate checks the node channel flags.
func (o *RouteOptions) Validate() error {
	if o.Service == "" {
		return nil
	}
	var errs []error
	for _, f := range []struct{ name, value string }{
		{"--node-channel-namespace", o.Namespace}, {"--capacity-namespace", o.CapacityNamespace}, {"--node-channel-port-name", o.PortName},
		{"--node-service-account", o.ServiceAccount}, {"--node-token-audience", o.Audience}, {"--node-channel-ca", o.CAName},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("%s: must be set when --node-channel-service is", f.name))
		}
	}
	if o.CAValidity < minCAValidity {
		errs = append(errs, fmt.Errorf("--node-channel-ca-validity %s: must be at least %s", o.CAValidity, minCAValidity))
	}
	if o.CAPropagation <= 0 {
		errs = append(errs, fmt.Errorf("--node-channel-ca-propagation %s: must be positive", o.CAPropagation))
	}
	return errors.Join(errs...)
}

// minCAValidity leaves a rotation, started at a third of the CA's life, room
// to reach every node first.
const minCAValidity = time.Minute

type route struct {
	server *router.Server
	// run runs what every replica runs, and the leader's duties when leading.
	run     func(context.Context) error
	leading []func(context.Context) error
}

// startRoute builds the routing controller and its duties.
func startRoute(ctx context.Context, o *ControllerOptions, client kubernetes.Interface, objs *objects.Cache,
	reg prometheus.Registerer) (*route, error) {
	nc := &o.Route
	var pool *agents.Pool // set below: the store's hooks run only once Run starts
	store, err := castore.New(castore.Config{Client: client, Namespace: nc.Namespace, Name: nc.CAName, Registerer: reg,
		Policy:   castore.Policy{Validity: nc.CAValidity, Propagation: nc.CAPropagation},
		Accepted: func(ctx context.Context, ca *nodeca.CA) error { return pool.Accepts(ctx, ca) },
	})
	if err != nil {
		return nil, err
	}
	cas, err := store.Start(ctx)
	if err != nil {
		return nil, fmt.Errorf("the node channel's CA: %w", err)
	}
	iss, err := nodeca.NewIssuer(cas.Active, nodeca.IssuerOptions{})
	if err != nil {
		return nil, err
	}
	own, err := iss.IssueController()
	if err != nil {
		return nil, fmt.Errorf("the controller's certificate: %w", err)
	}
	trust := nodeca.NewPool(cas.Trusted()...)
	writer, err := capacity.New(capacity.Config{Client: client, Namespace: nc.CapacityNamespace,
		Driver: o.DriverName, TopologyKey: topology.Key, Registerer: reg})
	if err != nil {
		return nil, err
	}
	identity := nodeca.NewKeypair(own)
	pvs, err := pvindex.New(objs, o.DriverName, topology.Key)
	if err != nil {
		return nil, err
	}
	keys, onKeyRequest, err := volumeKeys(client, nc, pvs, reg)
	if err != nil {
		return nil, err
	}
	pool, err = agents.New(agents.Config{Client: client, Namespace: nc.Namespace, Service: nc.Service,
		PortName: nc.PortName, ServiceAccount: nc.ServiceAccount, Audience: nc.Audience,
		Issuer: iss, Identity: identity, Trust: trust, OnCapacity: writer.Report, OnKeyRequest: onKeyRequest, Registerer: reg})
	if err != nil {
		return nil, err
	}
	place, err := startPlacement(ctx, o, client, objs, writer, pvs, reg)
	if err != nil {
		return nil, err
	}
	refusals, err := router.NewRefusals(reg)
	if err != nil {
		return nil, err
	}
	srv := router.New(router.Config{Nodes: pool, Volumes: pvs, TopologyKey: topology.Key, Agents: pool, Moves: mover.Claims{PVs: pvs},
		Refusals: refusals, Sent: router.ClaimAnnotations{Client: client}, Keys: keys})
	move, err := startMover(ctx, o, client, objs, srv, reg)
	if err != nil {
		return nil, err
	}
	store.OnChange(func(ctx context.Context, st castore.State) {
		trust.Set(st.Trusted()...)
		if !castore.SameCA(iss.CA(), st.Active) {
			iss.SetCA(st.Active)
			if err := pool.Reissue(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Reissuing the node channel's certificates under the new CA")
			}
		}
	})
	duties := []func(context.Context) error{pool.Run, store.Run, func(ctx context.Context) error {
		return o.leadCapacity(ctx, client, writer, capacityRejoinDelay)
	}}
	leading := []func(context.Context) error{place, move}
	if o.Audit.Interval > 0 {
		dyn, err := kube.Dynamic(o.Kubeconfig, "carve-controller")
		if err != nil {
			return nil, fmt.Errorf("the audit: %w", err)
		}
		leading = append(leading, startAudit(ctx, o, client, dyn, pvs, pool, reg))
	}
	return &route{server: srv, run: func(ctx context.Context) error { return runAll(ctx, duties...) }, leading: leading}, nil
}

// capacityRejoinDelay is twice the Lease's duration, so other replicas,
// trying every few seconds, take the Lease first.
const capacityRejoinDelay = 30 * time.Second

// leadCapacity runs the capacity writer under capacityLease. A writer that
// held deletions for its grace (too few nodes reach this replica) releases
// the Lease for a replica that reaches them; the process goes on, as its
// other duties do not depend on that Lease.
func (o *ControllerOptions) leadCapacity(ctx context.Context, client kubernetes.Interface, w *capacity.Writer,
	rejoin time.Duration) error {
	for {
		term, end := context.WithCancel(ctx)
		var gaveUp bool
		err := o.whileLeading(term, client, capacityLease, func(ctx context.Context) error {
			err := w.Run(ctx)
			if !errors.Is(err, capacity.ErrDeletionsHeld) {
				return err
			}
			gaveUp = true
			klog.FromContext(ctx).Error(err, "Giving up the capacity Lease to a replica that may reach the nodes",
				"lease", capacityLease, "standAgainIn", rejoin)
			// Ending the term releases the Lease and returns nil, not a lost Lease.
			end()
			return nil
		})
		end()
		if !gaveUp || ctx.Err() != nil {
			return err
		}
		if !o.LeaderElection {
			continue // the only writer: it starts again, with a new grace
		}
		t := time.NewTimer(rejoin)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// runAll runs fns until ctx ends or one fails, then stops the others.
func runAll(ctx context.Context, fns ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, len(fns))
	for _, fn := range fns {
		go func() { done <- fn(ctx) }()
	}
	var errs []error
	for range fns {
		if err := <-done; err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "A duty stopped; stopping the others")
			errs = append(errs, err)
		}
		cancel()
	}
	return errors.Join(errs...)
}

// volumeKeys is the encrypted volumes' keyring and key releaser; nil with
// --volume-kek-secret empty.
func volumeKeys(client kubernetes.Interface, nc *RouteOptions, pvs *pvindex.Index, reg prometheus.Registerer) (router.VolumeKeys,
	func(context.Context, string, *nodeagentv1.VolumeKeyRequest) *nodeagentv1.VolumeKeyAnswer, error) {
	if nc.VolumeKEK == "" {
		return nil, nil, nil
	}
	store := volumekey.NewStore(client, nc.Namespace, nc.VolumeKEK)
	rel, err := volumekey.NewReleaser(store, pvs, reg)
	if err != nil {
		return nil, nil, err
	}
	return store, rel.Answer, nil
}
