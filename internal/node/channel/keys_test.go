package channel

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
)

// TestVolumeKeys: a key request goes out on the controller's stream and
// its answer (the key, or a refusal) comes back to the caller; without a
// stream nothing is asked.
func TestVolumeKeys(t *testing.T) {
	e := newEnv(t)
	keys := e.agent.cfg.Keys
	if _, _, err := keys.VolumeKey(t.Context(), "vg/lv", "id", "w"); !errors.Is(err, ErrNoController) {
		t.Fatalf("without a stream: %v", err)
	}
	addr := e.serve(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := dial(t, addr, credentials.NewTLS(enrollTLS(mustCtrl(t, e.iss)))).VolumeKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The controller: a key for vg/good, a refusal for anything else.
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			a := &nodeagentv1.VolumeKeyAnswer{RequestId: r.GetRequestId()}
			if r.GetVolumeId() == "vg/good" && r.GetKeyId() == "id" && r.GetWrappedKey() == "w" {
				a.Key = bytes.Repeat([]byte{7}, 32)
				a.RewrappedKey = "w2"
			} else {
				a.Refused = "not yours"
			}
			if stream.Send(a) != nil {
				return
			}
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !keys.Connected() {
		if time.Now().After(deadline) {
			t.Fatal("the stream never registered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	key, rewrapped, err := keys.VolumeKey(t.Context(), "vg/good", "id", "w")
	if err != nil || !bytes.Equal(key, bytes.Repeat([]byte{7}, 32)) || rewrapped != "w2" {
		t.Fatalf("VolumeKey = %x, %q, %v", key, rewrapped, err)
	}
	var refused *KeyRefusedError
	if _, _, err := keys.VolumeKey(t.Context(), "vg/other", "id", "w"); !errors.As(err, &refused) || refused.Reason != "not yours" {
		t.Fatalf("refused: %v", err)
	}
	cancel()
	for keys.Connected() {
		if time.Now().After(deadline) {
			t.Fatal("the stream stayed registered after it ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
