package volumekey

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/volume"
)

// Holders finds carve's PVs of a volume handle; *pvindex.Index is one.
type Holders interface {
	// HoldersOf returns handle's PVs; an error means the index is not filled.
	HoldersOf(handle string) ([]pvindex.Holder, error)
}

// Keys is the keyring's source; *Store is one.
type Keys interface {
	Keyring(ctx context.Context) (*Keyring, error)
	Reload(ctx context.Context) (*Keyring, error)
}

// The reasons of carve_volume_key_refusals_total.
const (
	// RefusedVolumeID: no carve volume ID.
	RefusedVolumeID = "volume_id"
	// RefusedNoVolume: no PersistentVolume holds the volume.
	RefusedNoVolume = "no_volume"
	// RefusedOtherNode: a PV of the volume pins it to another node.
	RefusedOtherNode = "other_node"
	// RefusedKeyID: the key ID is not the one the PV records.
	RefusedKeyID = "key_id"
	// RefusedUnwrap: the wrapped key does not unwrap for that key ID.
	RefusedUnwrap = "unwrap"
)

// Releaser answers the nodes' volume key requests. It trusts a node only
// about itself: a key is released only for a volume whose PVs all pin it to
// the asking node and record the key ID asked for.
type Releaser struct {
	keys     Keys
	holders  Holders
	released prometheus.Counter
	refused  *prometheus.CounterVec
}

// NewReleaser returns a Releaser with its metrics registered with reg.
func NewReleaser(keys Keys, holders Holders, reg prometheus.Registerer) (*Releaser, error) {
	r := &Releaser{keys: keys, holders: holders,
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "carve_volume_keys_released_total",
			Help: "Volume keys of encrypted volumes carve controller unwrapped for the node that holds the volume (one per open of a volume by NodeStageVolume).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_volume_key_refusals_total",
			Help: "Requests of node agents for a volume key that carve controller refused, by node and reason (volume_id, no_volume, other_node, key_id, unwrap); other_node and key_id are a node asking for what is not its own.",
		}, []string{"node", "reason"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{r.released, r.refused} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("volume keys: registering metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Answer answers one request; node is the verified connection's identity.
func (r *Releaser) Answer(ctx context.Context, node string, req *nodeagentv1.VolumeKeyRequest) *nodeagentv1.VolumeKeyAnswer {
	ans := &nodeagentv1.VolumeKeyAnswer{RequestId: req.GetRequestId()}
	key, reason, err := r.release(ctx, node, req)
	switch {
	case err == nil:
		ans.Key = key
		ans.RewrappedKey = r.rewrap(ctx, req, key)
		r.released.Inc()
		klog.FromContext(ctx).V(2).Info("Released a volume key to its node", "node", node, "volumeID", req.GetVolumeId(), "keyID", req.GetKeyId())
	case reason != "":
		ans.Refused = err.Error()
		r.refused.WithLabelValues(node, reason).Inc()
		klog.FromContext(ctx).Error(err, "Refused a node's request for a volume key", "node", node, "volumeID", req.GetVolumeId(), "keyID", req.GetKeyId(), "reason", reason)
	default:
		ans.Refused = err.Error()
		klog.FromContext(ctx).Error(err, "Could not answer a node's request for a volume key", "node", node, "volumeID", req.GetVolumeId())
	}
	return ans
}

// release checks the request and unwraps the key; reason is set for a
// refusal, empty for the controller's own failure.
func (r *Releaser) release(ctx context.Context, node string, req *nodeagentv1.VolumeKeyRequest) (key []byte, reason string, err error) {
	id := req.GetVolumeId()
	if _, err := volume.ParseID(id); err != nil {
		return nil, RefusedVolumeID, fmt.Errorf("volume_id %q: %w", id, err)
	}
	holders, err := r.holders.HoldersOf(id)
	if err != nil {
		return nil, "", fmt.Errorf("volume %s: which PersistentVolume holds it is not known yet: %w; retry later", id, err)
	}
	if len(holders) == 0 {
		return nil, RefusedNoVolume, fmt.Errorf("volume %s: no PersistentVolume holds it, so its key is released to no node", id)
	}
	for _, h := range holders {
		if h.Node != node {
			return nil, RefusedOtherNode, fmt.Errorf("volume %s: PersistentVolume %s pins it to node %q, not to %s, which asked for its key", id, h.PV, h.Node, node)
		}
		if h.KeyID == "" || h.KeyID != req.GetKeyId() {
			return nil, RefusedKeyID, fmt.Errorf("volume %s: PersistentVolume %s records key ID %q; the request names %q", id, h.PV, h.KeyID, req.GetKeyId())
		}
	}
	ring, err := r.keys.Keyring(ctx)
	if err != nil {
		return nil, "", err
	}
	if kek, kerr := KEKOf(req.GetWrappedKey()); kerr == nil && !ring.Has(kek) {
		// Another replica may have rotated since this one read the Secret.
		if ring, err = r.keys.Reload(ctx); err != nil {
			return nil, "", err
		}
	}
	key, err = ring.Unwrap(req.GetKeyId(), req.GetWrappedKey())
	if errors.Is(err, ErrUnwrap) {
		return nil, RefusedUnwrap, fmt.Errorf("volume %s: %w", id, err)
	}
	return key, "", err
}

// rewrap is the key under the newest KEK when it is under an older one,
// else "".
func (r *Releaser) rewrap(ctx context.Context, req *nodeagentv1.VolumeKeyRequest, key []byte) string {
	ring, err := r.keys.Keyring(ctx)
	if err != nil {
		return ""
	}
	if kek, err := KEKOf(req.GetWrappedKey()); err != nil || kek == ring.Newest() {
		return ""
	}
	w, err := ring.Wrap(req.GetKeyId(), key)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Wrapping a volume key under the newest key-encryption key", "volumeID", req.GetVolumeId())
		return ""
	}
	return w
}
