package agents

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/nodeca"
)

// keepaliveParams detect a dead node within about 20 s. The agent's server
// must permit pings this often (EnforcementPolicy MinTime ≤ 10 s,
// PermitWithoutStream), or it closes the connection as abusive.
var keepaliveParams = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}

func (p *Pool) dial(addr string, cfg *tls.Config) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithKeepaliveParams(keepaliveParams),
		// The capacity stream keeps the connection busy; never idle it either.
		grpc.WithIdleTimeout(0))
	if err != nil {
		return nil, fmt.Errorf("node channel to %s: %w", addr, err)
	}
	return conn, nil
}

// agent is the pool's side of one agent endpoint: enrollment, the verified
// connection and its capacity stream.
type agent struct {
	p      *Pool
	ep     endpoint
	cancel context.CancelFunc
	done   chan struct{}
	renew  chan struct{} // enroll again now: another CA signs

	mu      sync.Mutex
	conn    *grpc.ClientConn // the verified connection; nil while there is none
	lastErr error            // why there is none
	tried   bool             // an enrollment has ended, well or not
	// acceptedCA is the next CA (DER) this agent was seen to accept; its bundle
	// only grows until the switch, so it is not asked again.
	acceptedCA []byte
}

func newAgent(p *Pool, ep endpoint) *agent {
	return &agent{p: p, ep: ep, done: make(chan struct{}), renew: make(chan struct{}, 1), lastErr: errors.New("not enrolled yet")}
}

func (a *agent) start(ctx context.Context) {
	log := klog.FromContext(ctx).WithValues("node", a.ep.Node, "pod", a.ep.Pod, "address", a.ep.Addr)
	ctx, a.cancel = context.WithCancel(klog.NewContext(ctx, log))
	go a.run(ctx)
}

// stop closes the connections and waits for the goroutines, so no capacity
// report follows.
func (a *agent) stop() {
	if a.cancel == nil {
		return
	}
	a.cancel()
	<-a.done
}

func (a *agent) current(node string) (*grpc.ClientConn, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.conn == nil && !a.tried:
		// Not ErrUnreachable: a create refused now would move the claim off a
		// healthy node (the router answers UNAVAILABLE instead).
		return nil, fmt.Errorf("node %s: its agent's first enrollment since the controller started has not finished", node)
	case a.conn == nil:
		return nil, fmt.Errorf("node %s: no verified connection (%w): %w", node, a.lastErr, ErrUnreachable)
	}
	return a.conn, nil
}

func (a *agent) set(conn *grpc.ClientConn, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.conn, a.lastErr, a.tried = conn, err, true
}

// run keeps a verified connection until ctx ends, enrolling again at half
// the certificate's life and whenever the connection is lost, with backoff.
func (a *agent) run(ctx context.Context) {
	defer close(a.done)
	log := klog.FromContext(ctx)
	var draining sync.WaitGroup
	defer draining.Wait()
	var cur *link
	defer func() {
		if cur != nil {
			cur.close()
		}
	}()
	bo := backoff{min: a.p.t.minBackoff, max: a.p.t.maxBackoff}
	for {
		var wait time.Duration
		next, err := a.connect(ctx)
		switch {
		case ctx.Err() != nil:
			if next != nil {
				next.close()
			}
			return
		case err != nil:
			wait = bo.next()
			if cur == nil {
				a.set(nil, err)
			}
			log.Error(err, "Node agent not connected; retrying", "retryIn", wait, "stillServing", cur != nil)
		default:
			bo.reset()
			if old := cur; old != nil {
				old.stopWatch()
				draining.Go(func() { old.drain(ctx, a.p.t.drainGrace) })
				log.V(2).Info("Node agent certificate renewed", "renewAt", next.renewAt)
			} else {
				log.Info("Node agent connected", "renewAt", next.renewAt)
			}
			cur = next
			a.set(cur.conn, nil)
			a.p.certExpiry.WithLabelValues(roleNode, a.ep.Node).Set(float64(next.notAfter.Unix()))
			cur.startWatch(ctx, a)
			wait = time.Until(cur.renewAt)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-a.renew:
			t.Stop()
			log.Info("Node agent enrolls again: another CA signs")
		case <-cur.lostCh():
			t.Stop()
			if ctx.Err() != nil {
				return // the link saw the end first
			}
			lived := time.Since(cur.since)
			cur.close()
			cur = nil
			a.set(nil, errors.New("connection lost; enrolling again"))
			log.Info("Node agent connection lost; enrolling again", "lived", lived)
			if lived < a.p.t.maxBackoff && !sleep(ctx, bo.next()) {
				return // a connection that keeps dropping is not re-enrolled in a loop
			}
		}
	}
}

func (a *agent) connect(ctx context.Context) (*link, error) {
	// A controller starting beside a thousand agents enrolls a few at a time,
	// so no TokenReview waits out its timeout in client-go's rate limiter.
	select {
	case a.p.enrollSlots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	cert, err := a.enroll(ctx)
	<-a.p.enrollSlots
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	a.p.countEnrollment(err)
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	conn, err := a.dialVerified(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	renew := max(cert.NotAfter.Sub(now)/2, a.p.t.minBackoff)
	l := newLink(ctx, conn, now, now.Add(renew))
	l.notAfter = cert.NotAfter
	return l, nil
}

// dialVerified opens the connection every other call uses: the agent must
// present carve://node/<node> from a trusted CA. It returns once ready, or
// with the handshake's error.
func (a *agent) dialVerified(ctx context.Context) (*grpc.ClientConn, error) {
	cfg, err := nodeca.ClientConfig(nodeca.Peer{Cert: a.p.cfg.Identity, CAs: a.p.cfg.Trust}, a.ep.Node)
	if err != nil {
		return nil, err
	}
	// gRPC's states do not say why a handshake failed; keep the reason.
	var refused atomic.Pointer[error]
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		err := verify(cs)
		if err != nil {
			refused.Store(&err)
		}
		return err
	}
	conn, err := a.p.dial(a.ep.Addr, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.p.t.callTimeout)
	defer cancel()
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return conn, nil
		}
		if s == connectivity.TransientFailure || !conn.WaitForStateChange(ctx, s) {
			_ = conn.Close() // never used
			why := errors.New("no connection")
			if e := refused.Load(); e != nil {
				why = *e
			} else if ctx.Err() != nil {
				why = ctx.Err()
			}
			return nil, fmt.Errorf("verified connection: %w", why)
		}
	}
}

type link struct {
	conn     *grpc.ClientConn
	since    time.Time
	renewAt  time.Time
	notAfter time.Time     // of the node's certificate
	lost     chan struct{} // closed when the connection leaves Ready, or the agent stops

	watchStop context.CancelFunc
	watchDone chan struct{}
}

func newLink(ctx context.Context, conn *grpc.ClientConn, since, renewAt time.Time) *link {
	l := &link{conn: conn, since: since, renewAt: renewAt, lost: make(chan struct{})}
	go func() {
		defer close(l.lost)
		for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
			if !conn.WaitForStateChange(ctx, s) {
				return
			}
		}
	}()
	return l
}

func (l *link) lostCh() <-chan struct{} {
	if l == nil {
		return nil
	}
	return l.lost
}

// startWatch feeds the capacity stream to OnCapacity until stopWatch,
// reopening it whenever it ends.
func (l *link) startWatch(ctx context.Context, a *agent) {
	ctx, l.watchStop = context.WithCancel(ctx)
	l.watchDone = make(chan struct{})
	client := nodeagentv1.NewNodeAgentClient(l.conn)
	go func() {
		defer close(l.watchDone)
		var keys sync.WaitGroup
		if a.p.cfg.OnKeyRequest != nil {
			keys.Go(func() {
				a.keepStream(ctx, "Volume key stream", "The node agent serves no volume keys", func(bo *backoff) error {
					return a.answerKeys(ctx, client, bo)
				})
			})
		}
		a.keepStream(ctx, "Capacity stream", "", func(bo *backoff) error { return a.readCapacity(ctx, client, bo) })
		keys.Wait()
	}()
}

func (l *link) stopWatch() {
	if l.watchStop != nil {
		l.watchStop()
		<-l.watchDone
		l.watchStop = nil
	}
}

func (l *link) close() {
	l.stopWatch()
	_ = l.conn.Close() // in-flight calls fail with Canceled; the pool is stopping or the connection is gone
}

// drain closes a replaced connection after grace, so calls made on it
// finish, or at once when the agent stops.
func (l *link) drain(ctx context.Context, grace time.Duration) {
	sleep(ctx, grace)
	l.close()
}

// keepStream runs stream (one life of a stream, which resets the backoff
// at each message) again after a backoff each time it ends, until ctx ends;
// what names the stream in the log. When unserved is set, an agent that
// does not serve the stream (UNIMPLEMENTED: one without encrypted volumes,
// no cryptsetup, serves no volume keys) is asked again after the longest
// backoff and logged only at V(2), with unserved.
func (a *agent) keepStream(ctx context.Context, what, unserved string, stream func(*backoff) error) {
	log := klog.FromContext(ctx)
	bo := backoff{min: a.p.t.minBackoff, max: a.p.t.maxBackoff}
	for {
		err := stream(&bo)
		if ctx.Err() != nil {
			return
		}
		wait := bo.next()
		if unserved != "" && status.Code(err) == codes.Unimplemented {
			log.V(2).Info(unserved, "err", err.Error())
			wait = a.p.t.maxBackoff
		} else {
			log.Error(err, what+" ended; reopening", "retryIn", wait)
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}

func (a *agent) readCapacity(ctx context.Context, client nodeagentv1.NodeAgentClient, bo *backoff) error {
	stream, err := client.WatchCapacity(ctx, &nodeagentv1.WatchCapacityRequest{})
	if err != nil {
		return fmt.Errorf("WatchCapacity: %w", err)
	}
	return receive(bo, "WatchCapacity", stream.Recv, func(r *nodeagentv1.CapacityReport) error {
		if n := r.GetNodeName(); n != "" && n != a.ep.Node {
			// The connection is verified as a.ep.Node; a report about another node is
			// an agent bug, never data to trust.
			klog.FromContext(ctx).Error(nil, "Capacity report names another node; dropped", "reportNode", n)
			return nil
		}
		a.p.cfg.OnCapacity(a.ep.Node, r)
		return nil
	})
}

// answerKeys answers the VolumeKeys stream's requests with OnKeyRequest
// until it ends.
func (a *agent) answerKeys(ctx context.Context, client nodeagentv1.NodeAgentClient, bo *backoff) error {
	stream, err := client.VolumeKeys(ctx)
	if err != nil {
		return fmt.Errorf("VolumeKeys: %w", err)
	}
	return receive(bo, "VolumeKeys", stream.Recv, func(req *nodeagentv1.VolumeKeyRequest) error {
		return stream.Send(a.p.cfg.OnKeyRequest(ctx, a.ep.Node, req))
	})
}

// receive hands each message of a stream to handle, resetting bo at each,
// until the stream or handle fails; method names the stream in the error.
func receive[M any](bo *backoff, method string, recv func() (M, error), handle func(M) error) error {
	for {
		m, err := recv()
		if err == nil {
			bo.reset()
			err = handle(m)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", method, err)
		}
	}
}

type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
