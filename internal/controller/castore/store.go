package castore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/nodeca"
)

// Config configures a Store.
type Config struct {
	Client          kubernetes.Interface
	Namespace, Name string
	Policy          Policy
	// Interval is how often the Secret is read; 0 means DefaultInterval or a
	// twentieth of Policy.Validity if shorter.
	Interval time.Duration
	// Accepted returns nil when every agent accepts a certificate of ca; nil
	// makes the switch wait Policy.Propagation.
	Accepted func(ctx context.Context, ca *nodeca.CA) error
	// Registerer, when set, gets the expiry and rotation metrics.
	Registerer prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultInterval: every replica sees another's rotation within it.
const DefaultInterval = 30 * time.Second

// Store keeps the node channel's CA current in a Secret and its ConfigMap.
type Store struct {
	cfg       Config
	onChange  func(context.Context, State)
	last      State
	expiry    *prometheus.GaugeVec
	rotations *prometheus.CounterVec
}

// New checks cfg and returns its Store.
func New(cfg Config) (*Store, error) {
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Name == "" {
		return nil, errors.New("CA store: a client, a namespace and a name are required")
	}
	cfg.Policy = cfg.Policy.withDefaults()
	if cfg.Interval == 0 {
		cfg.Interval = min(DefaultInterval, cfg.Policy.Validity/20)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Store{cfg: cfg, onChange: func(context.Context, State) {},
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_node_channel_ca_expiry_timestamp_seconds",
			Help: "When each CA of the node channel expires (Unix seconds): ca is active (signs), next (trusted, staged) or previous (trusted until its leaves expire).",
		}, []string{"ca"}),
		rotations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_node_channel_ca_rotations_total",
			Help: "Steps of node channel CA rotations this controller took: staged, switched, dropped, or replaced (an expired CA).",
		}, []string{"step"}),
	}
	for _, st := range []step{stepStage, stepSwitch, stepDrop, stepReplaced} {
		s.rotations.WithLabelValues(string(st))
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{s.expiry, s.rotations} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("CA store metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Start reads the CA (making it, taking a due step), publishes the trusted CAs and returns
// the state. Concurrent replicas: one write wins, the others read it back. A Secret
// without a usable CA is an error, never replaced silently.
func (s *Store) Start(ctx context.Context) (State, error) {
	st, err := s.sync(ctx, false)
	if err != nil {
		return State{}, err
	}
	s.last = st
	return st, nil
}

// OnChange makes fn get each new State after Start's; call it before Run.
func (s *Store) OnChange(fn func(context.Context, State)) { s.onChange = fn }

// Run reads the Secret every Interval until ctx ends, taking due steps and
// calling OnChange. A failed read is retried; the CAs in use stay.
func (s *Store) Run(ctx context.Context) error {
	log := klog.FromContext(ctx)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		st, err := s.sync(ctx, true)
		if err != nil {
			log.Error(err, "Keeping the node channel's CA; trying again", "retryIn", s.cfg.Interval)
			continue
		}
		if !sameCAs(st, s.last) {
			s.last = st
			s.onChange(ctx, st)
		}
	}
}

// sync takes at most one step, so a staged CA is published before anything
// switches to it. probe allows asking the agents about the next CA (not
// before Run: no connections yet).
func (s *Store) sync(ctx context.Context, probe bool) (State, error) {
	c := s.cfg
	secret, st, err := read(ctx, c.Client, c.Namespace, c.Name)
	if err != nil {
		return State{}, err
	}
	if secret == nil {
		if st, err = create(ctx, c.Client, c.Namespace, c.Name, c.Policy); err != nil {
			return State{}, err
		}
		return st, s.publish(ctx, st)
	}
	if err := s.publish(ctx, st); err != nil {
		return State{}, err
	}
	now := c.Now()
	nextTrusted := false
	if probe && st.Next != nil && c.Accepted != nil {
		err := c.Accepted(ctx, st.Next)
		nextTrusted = err == nil
		if err != nil {
			klog.FromContext(ctx).V(2).Info("Not every node agent accepts the next CA yet", "reason", err.Error())
		}
	}
	step := plan(st, now, c.Policy, nextTrusted)
	if step == stepNone {
		return st, nil
	}
	next, err := apply(st, step, now, c.Policy, func() (*nodeca.CA, error) {
		return nodeca.NewCA(nodeca.CAOptions{Now: c.Now, Validity: c.Policy.Validity})
	})
	if err != nil {
		return State{}, fmt.Errorf("CA rotation, step %s: %w", step, err)
	}
	updated, err := toSecret(secret, next)
	if err != nil {
		return State{}, fmt.Errorf("CA rotation, step %s: %w", step, err)
	}
	written, err := c.Client.CoreV1().Secrets(c.Namespace).Update(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		// Another replica took a step first; it is read next time.
		return st, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("CA rotation, step %s: writing Secret %s/%s: %w", step, c.Namespace, c.Name, err)
	}
	if st, err = fromSecret(written); err != nil {
		return State{}, err
	}
	s.rotations.WithLabelValues(string(step)).Inc()
	logStep(ctx, step, st, c)
	return st, s.publish(ctx, st)
}

func logStep(ctx context.Context, st step, s State, c Config) {
	log := klog.FromContext(ctx).WithValues("secret", c.Namespace+"/"+c.Name, "step", st)
	switch st {
	case stepStage:
		log.Info("Node channel CA rotation: the next CA is trusted beside the current one", "nextNotAfter", s.Next.Cert.NotAfter,
			"switchWithin", c.Policy.Propagation)
	case stepSwitch:
		log.Info("Node channel CA rotation: the next CA signs now; every certificate is reissued", "notAfter", s.Active.Cert.NotAfter,
			"previousTrustedUntil", s.PreviousUntil)
	case stepDrop:
		log.Info("Node channel CA rotation: the previous CA is no longer trusted")
	case stepReplaced:
		log.Error(nil, "The node channel CA had expired: replaced by a new one; every node enrolls again once its kubelet "+
			"has written the new CA bundle", "notAfter", s.Active.Cert.NotAfter)
	}
}

// publish writes the trusted CAs to the ConfigMap and their expiries to the
// metric.
func (s *Store) publish(ctx context.Context, st State) error {
	if err := ensureBundle(ctx, s.cfg.Client, s.cfg.Namespace, s.cfg.Name, st.Trusted()); err != nil {
		return err
	}
	set := func(ca string, on bool, notAfter time.Time) {
		if on {
			s.expiry.WithLabelValues(ca).Set(float64(notAfter.Unix()))
		} else {
			s.expiry.DeleteLabelValues(ca)
		}
	}
	set("active", true, st.Active.Cert.NotAfter)
	set("next", st.Next != nil, notAfterOf(st.Next))
	set("previous", st.Previous != nil, st.PreviousUntil)
	return nil
}

func notAfterOf(ca *nodeca.CA) time.Time {
	if ca == nil {
		return time.Time{}
	}
	return ca.Cert.NotAfter
}
