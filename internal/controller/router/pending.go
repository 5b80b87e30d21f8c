package router

import (
	"sync"

	"google.golang.org/grpc/codes"
)

// pending remembers, by CSI volume name, the node a CreateVolume was sent
// to until the node's answer says whether it started it (the codes
// csi-provisioner reads as "may be in progress" do not: it retries on the
// same node). While a name is pending, not reaching that node is
// UNAVAILABLE, not RESOURCE_EXHAUSTED: this call sent nothing, but an
// earlier one may have made the volume there, and moving the claim would
// leave that LV behind. A definite answer from the node clears the name.
//
// It is for requests that name no claim; for one that does, the claim's
// AnnCreateSentTo (sent.go) holds the same fact where every replica, and
// a controller that restarted, reads it.
type pending struct {
	mu    sync.Mutex
	names map[string]string // CSI volume name -> node
}

// maxPending bounds the names remembered; beyond it, new ones are not
// (a cluster with that many creates in doubt has a larger problem).
const maxPending = 10000

// maybeStarted tells whether a CreateVolume of name sent to node may
// have started there.
func (p *pending) maybeStarted(name, node string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.names[name] == node
}

// sending records that a CreateVolume of name is about to be sent to
// node.
func (p *pending) sending(name, node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.names == nil {
		p.names = map[string]string{}
	}
	if _, ok := p.names[name]; ok || len(p.names) < maxPending {
		p.names[name] = node
	}
}

// answered records the answer node gave to a CreateVolume of name.
func (p *pending) answered(name, node string, code codes.Code) {
	if !definite(code) {
		p.sending(name, node)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.names[name] == node {
		delete(p.names, name)
	}
}

// definite tells an answer that says whether the node made the volume:
// every code but those csi-provisioner reads as "may be in progress".
func definite(code codes.Code) bool {
	switch code {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.Aborted:
		return false
	}
	return true
}
