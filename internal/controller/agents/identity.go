package agents

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/nodeca"
)

// The values of carve_node_channel_certificate_expiry_timestamp_seconds's
// role label.
const (
	roleController = "controller"
	roleNode       = "node"
)

// probeTimeout bounds one agent's answer to Accepts.
const probeTimeout = 10 * time.Second

// maxProbing is how many agents Accepts asks at once.
const maxProbing = 16

// Accepts returns nil when every agent of the pool accepts the controller's
// certificate signed by ca, asked once each over a new connection. An agent
// not connected counts as not accepting: it may lack the CA's bundle yet.
func (p *Pool) Accepts(ctx context.Context, ca *nodeca.CA) error {
	select {
	case <-p.synced:
	default:
		return errors.New("the controller has not listed the node agents yet")
	}
	p.mu.Lock()
	agents := make([]*agent, 0, len(p.agents))
	for _, a := range p.agents {
		if !a.hasAccepted(ca) {
			agents = append(agents, a)
		}
	}
	p.mu.Unlock()
	if len(agents) == 0 {
		return nil
	}
	iss, err := nodeca.NewIssuer(ca, nodeca.IssuerOptions{ControllerValidity: time.Hour})
	if err != nil {
		return err
	}
	cert, err := iss.IssueController()
	if err != nil {
		return err
	}
	id := nodeca.NewKeypair(cert)
	slices.SortFunc(agents, func(a, b *agent) int { return cmp.Compare(a.ep.Node, b.ep.Node) })
	errs := make([]error, len(agents))
	slots := make(chan struct{}, maxProbing)
	var wg sync.WaitGroup
	for i, a := range agents {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := a.accepts(ctx, id); err != nil {
				errs[i] = fmt.Errorf("node %s: %w", a.ep.Node, err)
				return
			}
			a.mu.Lock()
			a.acceptedCA = ca.Cert.Raw
			a.mu.Unlock()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// hasAccepted tells whether the agent was seen to accept ca.
func (a *agent) hasAccepted(ca *nodeca.CA) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return bytes.Equal(a.acceptedCA, ca.Cert.Raw)
}

// accepts calls the agent's Identity service presenting id.
func (a *agent) accepts(ctx context.Context, id *nodeca.Keypair) error {
	if _, err := a.current(a.ep.Node); err != nil {
		return err
	}
	cfg, err := nodeca.ClientConfig(nodeca.Peer{Cert: id, CAs: a.p.cfg.Trust}, a.ep.Node)
	if err != nil {
		return err
	}
	conn, err := a.p.dial(a.ep.Addr, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }() // the one call below has returned
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, err = csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	return err
}

// Reissue gives the controller a certificate of the Issuer's CA now and
// has every agent enroll again, so that every leaf on the channel comes
// from the CA that signs. The connections open now serve their calls
// until the new ones replace them.
func (p *Pool) Reissue(ctx context.Context) error {
	if err := p.renewIdentity(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.agents {
		select {
		case a.renew <- struct{}{}:
		default:
		}
	}
	klog.FromContext(ctx).Info("Every node agent enrolls again under the CA that signs now", "agents", len(p.agents))
	return nil
}

// renewIdentity issues the controller a new certificate.
func (p *Pool) renewIdentity() error {
	cert, err := p.cfg.Issuer.IssueController()
	if err != nil {
		return fmt.Errorf("the controller's node channel certificate: %w", err)
	}
	p.cfg.Identity.Set(cert)
	p.certExpiry.WithLabelValues(roleController, "").Set(float64(cert.Leaf.NotAfter.Unix()))
	select {
	case p.identityChanged <- struct{}{}:
	default:
	}
	return nil
}

// keepIdentity renews the controller's certificate at half its life, so
// that the one it presents never expires while it runs, until ctx ends.
func (p *Pool) keepIdentity(ctx context.Context) {
	log := klog.FromContext(ctx)
	bo := backoff{min: p.t.minBackoff, max: p.t.maxBackoff}
	for {
		wait := time.Hour
		if leaf := p.cfg.Identity.Current().Leaf; leaf != nil {
			wait = max(time.Until(leaf.NotAfter)/2, p.t.minBackoff)
			p.certExpiry.WithLabelValues(roleController, "").Set(float64(leaf.NotAfter.Unix()))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.identityChanged:
			t.Stop()
			continue
		case <-t.C:
		}
		if err := p.renewIdentity(); err != nil {
			// The current one is valid for another half of its life.
			retry := bo.next()
			log.Error(err, "Renewing the controller's node channel certificate failed; trying again", "retryIn", retry)
			sleep(ctx, retry)
			continue
		}
		bo.reset()
	}
}
