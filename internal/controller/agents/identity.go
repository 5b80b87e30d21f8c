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

// Values of carve_node_channel_certificate_expiry_timestamp_seconds's role.
const (
	roleController = "controller"
	roleNode       = "node"
)

const probeTimeout = 10 * time.Second

const maxProbing = 16

// Accepts returns nil when every agent accepts the controller's certificate
// signed by ca. An unconnected agent counts as not accepting: it may lack
// the bundle yet.
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

func (a *agent) hasAccepted(ca *nodeca.CA) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return bytes.Equal(a.acceptedCA, ca.Cert.Raw)
}

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

// Reissue renews the controller's certificate from the signing CA and has
// every agent enroll again; open connections serve until replaced.
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

// keepIdentity renews the controller's certificate at half its life until
// ctx ends.
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
			retry := bo.next()
			log.Error(err, "Renewing the controller's node channel certificate failed; trying again", "retryIn", retry)
			sleep(ctx, retry)
			continue
		}
		bo.reset()
	}
}
