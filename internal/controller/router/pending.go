package router

import (
	"sync"

	"google.golang.org/grpc/codes"
)

// pending remembers, by name, the node a CreateVolume was sent to until an
// answer says whether it started (csi-provisioner retries "may be in
// progress" codes on the same node). Meanwhile an unreachable node is
// UNAVAILABLE, not RESOURCE_EXHAUSTED: moving the claim would leave an LV
// behind. Only for requests naming no claim; otherwise AnnCreateSentTo
// (sent.go) holds the fact for every replica.
type pending struct {
	mu    sync.Mutex
	names map[string]string // CSI volume name -> node
}

// maxPending bounds the names remembered (that many creates in doubt is a
// larger problem).
const maxPending = 10000

func (p *pending) maybeStarted(name, node string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.names[name] == node
}

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

// definite tells an answer that says whether the node made the volume.
func definite(code codes.Code) bool {
	switch code {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.Aborted:
		return false
	}
	return true
}
