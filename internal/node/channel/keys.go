package channel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// ErrNoController: no controller holds a VolumeKeys stream; nothing asked.
var ErrNoController = errors.New("no carve controller is connected to this node's agent")

// KeyRefusedError is the controller's refusal, its reason as written.
type KeyRefusedError struct{ Reason string }

func (e *KeyRefusedError) Error() string { return "carve controller refused the key: " + e.Reason }

// Keys carries key requests over the VolumeKeys streams the controller
// replicas open (the agent cannot dial them). Safe for concurrent use.
type Keys struct {
	mu      sync.Mutex
	streams []*keyStream
	next    uint64
	waiting map[uint64]chan *nodeagentv1.VolumeKeyAnswer
}

type keyStream struct {
	sendMu sync.Mutex // gRPC streams take one Send at a time
	s      grpc.BidiStreamingServer[nodeagentv1.VolumeKeyAnswer, nodeagentv1.VolumeKeyRequest]
	done   chan struct{}
}

// NewKeys returns a Keys with no stream.
func NewKeys() *Keys { return &Keys{waiting: map[uint64]chan *nodeagentv1.VolumeKeyAnswer{}} }

// VolumeKeys implements nodeagentv1.NodeAgentServer: a controller's stream,
// served until it ends (UNAVAILABLE at Shutdown).
func (a *Agent) VolumeKeys(stream grpc.BidiStreamingServer[nodeagentv1.VolumeKeyAnswer, nodeagentv1.VolumeKeyRequest]) error {
	if a.cfg.Keys == nil {
		return status.Errorf(codes.Unimplemented, "node %s opens no encrypted volumes", a.cfg.NodeName)
	}
	return a.cfg.Keys.serve(stream, a.stopping)
}

func (k *Keys) serve(s grpc.BidiStreamingServer[nodeagentv1.VolumeKeyAnswer, nodeagentv1.VolumeKeyRequest], stopping <-chan struct{}) error {
	ks := &keyStream{s: s, done: make(chan struct{})}
	k.mu.Lock()
	k.streams = append(k.streams, ks)
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		for i, x := range k.streams {
			if x == ks {
				k.streams = append(k.streams[:i], k.streams[i+1:]...)
				break
			}
		}
		k.mu.Unlock()
		close(ks.done)
	}()
	answers := make(chan error, 1)
	go func() {
		for {
			a, err := s.Recv()
			if err != nil {
				answers <- err
				return
			}
			k.mu.Lock()
			w, ok := k.waiting[a.GetRequestId()]
			delete(k.waiting, a.GetRequestId())
			k.mu.Unlock()
			if ok {
				w <- a
			}
		}
	}()
	select {
	case err := <-answers:
		return err
	case <-s.Context().Done():
		return status.FromContextError(s.Context().Err()).Err()
	case <-stopping:
		return status.Error(codes.Unavailable, "the node agent is shutting down")
	}
}

// Connected tells whether some controller holds a stream now.
func (k *Keys) Connected() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.streams) > 0
}

// VolumeKey asks a controller for volumeID's key over each stream in turn. It
// returns the key (and its rewrapping after a KEK rotation), a
// *KeyRefusedError, ErrNoController, or ctx's error.
func (k *Keys) VolumeKey(ctx context.Context, volumeID, keyID, wrapped string) (key []byte, rewrapped string, err error) {
	k.mu.Lock()
	streams := append([]*keyStream(nil), k.streams...)
	k.mu.Unlock()
	if len(streams) == 0 {
		return nil, "", ErrNoController
	}
	var errs []error
	for _, ks := range streams {
		a, err := k.ask(ctx, ks, volumeID, keyID, wrapped)
		if err == nil {
			return a.GetKey(), a.GetRewrappedKey(), nil
		}
		var refused *KeyRefusedError
		if errors.As(err, &refused) || ctx.Err() != nil {
			return nil, "", err
		}
		errs = append(errs, err)
	}
	return nil, "", fmt.Errorf("%w: every stream failed: %w", ErrNoController, errors.Join(errs...))
}

func (k *Keys) ask(ctx context.Context, ks *keyStream, volumeID, keyID, wrapped string) (*nodeagentv1.VolumeKeyAnswer, error) {
	w := make(chan *nodeagentv1.VolumeKeyAnswer, 1)
	k.mu.Lock()
	k.next++
	id := k.next
	k.waiting[id] = w
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		delete(k.waiting, id)
		k.mu.Unlock()
	}()
	ks.sendMu.Lock()
	err := ks.s.Send(&nodeagentv1.VolumeKeyRequest{RequestId: id, VolumeId: volumeID, KeyId: keyID, WrappedKey: wrapped})
	ks.sendMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("sending the key request: %w", err)
	}
	select {
	case a := <-w:
		if r := a.GetRefused(); r != "" || len(a.GetKey()) == 0 {
			if r == "" {
				r = "an empty key"
			}
			return nil, &KeyRefusedError{Reason: r}
		}
		return a, nil
	case <-ks.done:
		return nil, errors.New("the controller's stream ended before it answered")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
