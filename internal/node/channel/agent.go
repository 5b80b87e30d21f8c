package channel

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/nodeca"
)

// CapacitySource is the node's room per device class; *vgview.View is one.
type CapacitySource interface {
	// Capacity is the room of class d: the numbers GetCapacity answers.
	// An error (vgview.ErrClassUnavailable, wrapped) says why the class
	// cannot take volumes now.
	Capacity(d *deviceclass.DeviceClass) (vgview.Capacity, error)
	// Changes returns a channel closed at the next change that may move
	// what Capacity answers.
	Changes() <-chan struct{}
}

// InventorySource lists carve's volumes; *vgview.View is one.
type InventorySource interface {
	// Volumes lists carve's volumes in the configured volume groups.
	Volumes() []lvm.LogicalVolume
	// Readable tells whether the listing of volume group vg is fresh:
	// an LV absent from a readable volume group is gone.
	Readable(vg string) bool
}

// Orphans is the node's volume lifecycle as the controller's audit needs
// it; *provision.Provisioner is one.
type Orphans interface {
	// BusyNames lists the LV names with a call in flight now.
	BusyNames() []string
	// QuarantineOrphan deactivates, tags (with at) and renames an
	// orphaned LV under the per-volume locks, and returns its new name
	// ("" when it was gone): an error when a call on it is in flight,
	// when it is not carve's, has no claim tag, has snapshots or is open.
	QuarantineOrphan(ctx context.Context, vg, name string, at time.Time) (string, error)
	// RemoveOrphan removes a quarantined orphan (quarantined from the LV
	// name orphanOf) under the per-volume lock: an error when a call on
	// it is in flight, when it is not carve's, not that quarantine, or
	// has snapshots; nil when it is gone.
	RemoveOrphan(ctx context.Context, vg, name, orphanOf string) error
}

// Copies grants copies of this node's sources to other nodes;
// *peercopy.Server is one.
type Copies interface {
	// Authorize answers AuthorizeCopy, its errors gRPC statuses.
	Authorize(ctx context.Context, req *nodeagentv1.AuthorizeCopyRequest) (*nodeagentv1.AuthorizeCopyResponse, error)
}

// Config configures an Agent.
type Config struct {
	// NodeName is the node the agent serves (--node-name).
	NodeName string
	// TokenFile is the projected service-account token, audience carve's
	// controller. It is read at every Enroll: the kubelet refreshes it.
	TokenFile string
	// Trust holds the CAs the controller's certificate must chain to, and
	// a certificate installed for this node.
	Trust *nodeca.Pool
	// Classes are the device classes reported and the volume groups
	// listed.
	Classes *deviceclass.Config
	// Capacity answers WatchCapacity, Inventory answers Inventory.
	Capacity  CapacitySource
	Inventory InventorySource
	// Orphans tells the inventory which LVs are busy and removes orphans;
	// nil reports none busy and refuses every removal.
	Orphans Orphans
	// Copies grants copies to other nodes; nil grants none.
	Copies Copies
	// CatchUps brings this node's volumes up to date from other nodes
	// (the last copy of a move); nil takes none (catchup.go).
	CatchUps CatchUps
	// Blocks names the blocks of this node's snapshots (the controller's
	// SnapshotMetadata service); nil names none (blocks.go).
	Blocks Blocks
	// Keys carries the node's requests for the keys of its encrypted
	// volumes to the controllers' VolumeKeys streams; nil opens none
	// (keys.go).
	Keys *Keys
	// Now is the clock certificates are checked against; nil is time.Now.
	Now func() time.Time
}

// Agent serves nodeagentv1.NodeAgent. It is safe for concurrent use.
type Agent struct {
	nodeagentv1.UnimplementedNodeAgentServer
	cfg Config
	// key never leaves memory; cert holds what the listener presents.
	key  *ecdsa.PrivateKey
	cert *nodeca.Keypair
	// stopping is closed by Shutdown.
	stopping chan struct{}
	stopOnce sync.Once
}

// New returns an agent with a new key and a self-signed certificate.
func New(cfg Config) (*Agent, error) {
	var errs []error
	if err := nodeca.ValidateNodeName(cfg.NodeName); err != nil {
		errs = append(errs, err)
	}
	if cfg.TokenFile == "" {
		errs = append(errs, errors.New("node agent: no token file"))
	}
	if cfg.Trust == nil || cfg.Classes == nil || cfg.Capacity == nil || cfg.Inventory == nil {
		errs = append(errs, errors.New("node agent: a trust pool, the device classes and the capacity and inventory sources are required"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("node agent key: %w", err)
	}
	cert, err := nodeca.SelfSigned(key, cfg.NodeName)
	if err != nil {
		return nil, err
	}
	return &Agent{cfg: cfg, key: key, cert: nodeca.NewKeypair(cert), stopping: make(chan struct{})}, nil
}

// Shutdown ends every capacity stream (UNAVAILABLE: the controller
// reconnects), so that the server's graceful stop need not wait for
// streams that never end on their own. Call it when the server stops;
// calling it again does nothing.
func (a *Agent) Shutdown() { a.stopOnce.Do(func() { close(a.stopping) }) }

// ServerTLS is the node channel listener's TLS: TLS 1.3, presenting the
// agent's current certificate, completing a handshake only with a client
// that presents carve://controller from a CA in Trust.
func (a *Agent) ServerTLS() (*tls.Config, error) {
	return nodeca.ServerConfig(nodeca.Peer{Cert: a.cert, CAs: a.cfg.Trust, Now: a.cfg.Now})
}

// CopyTLS is the copy listener's TLS (--node-copy-address): TLS 1.3,
// presenting the agent's current certificate, completing a handshake
// only with a client that presents a node's certificate from a CA in
// Trust (nodeca.CopyServerConfig).
func (a *Agent) CopyTLS() (*tls.Config, error) {
	return nodeca.CopyServerConfig(nodeca.Peer{Cert: a.cert, CAs: a.cfg.Trust, Now: a.cfg.Now})
}

// Identity is the certificate the agent presents, which it also presents
// as a client when it reads a copy from another node.
func (a *Agent) Identity() *nodeca.Keypair { return a.cert }

// AuthorizeCopy implements nodeagentv1.NodeAgentServer.
func (a *Agent) AuthorizeCopy(ctx context.Context, req *nodeagentv1.AuthorizeCopyRequest) (*nodeagentv1.AuthorizeCopyResponse, error) {
	if a.cfg.Copies == nil {
		return nil, status.Errorf(codes.Unimplemented, "node %s serves no copies to other nodes (--node-copy-address is empty)", a.cfg.NodeName)
	}
	return a.cfg.Copies.Authorize(ctx, req)
}

// UnloggedMethods are the methods whose payloads must stay out of logs
// (csiserver.WithUnloggedPayloads): Enroll's response carries the node's
// token.
func UnloggedMethods() []string { return []string{nodeagentv1.NodeAgent_Enroll_FullMethodName} }
