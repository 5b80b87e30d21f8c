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
	// Capacity is class d's room as GetCapacity answers it, or why it cannot
	// take volumes (vgview.ErrClassUnavailable).
	Capacity(d *deviceclass.DeviceClass) (vgview.Capacity, error)
	// Changes is closed at the next change that may move Capacity.
	Changes() <-chan struct{}
}

// InventorySource lists carve's volumes; *vgview.View is one.
type InventorySource interface {
	Volumes() []lvm.LogicalVolume
	// Readable: an LV absent from a readable volume group is gone.
	Readable(vg string) bool
}

// Orphans is the lifecycle the controller's audit needs;
// *provision.Provisioner is one.
type Orphans interface {
	BusyNames() []string
	// QuarantineOrphan: see provision.Provisioner.QuarantineOrphan.
	QuarantineOrphan(ctx context.Context, vg, name string, at time.Time) (string, error)
	// RemoveOrphan: see provision.Provisioner.RemoveOrphan.
	RemoveOrphan(ctx context.Context, vg, name, orphanOf string) error
}

// Copies grants copies of local sources; *peercopy.Server is one.
type Copies interface {
	Authorize(ctx context.Context, req *nodeagentv1.AuthorizeCopyRequest) (*nodeagentv1.AuthorizeCopyResponse, error)
}

// Config configures an Agent.
type Config struct {
	NodeName string
	// TokenFile is the projected service-account token, read at every Enroll:
	// the kubelet refreshes it.
	TokenFile string
	// Trust holds the CAs the controller's certificate must chain to.
	Trust *nodeca.Pool
	// Classes are the classes reported and VGs listed.
	Classes *deviceclass.Config
	// Capacity answers WatchCapacity, Inventory answers Inventory.
	Capacity  CapacitySource
	Inventory InventorySource
	// Orphans reports busy LVs and removes orphans; nil refuses removals.
	Orphans Orphans
	Copies  Copies
	// CatchUps takes a move's last copy; nil takes none.
	CatchUps CatchUps
	// Blocks names snapshot blocks; nil names none.
	Blocks Blocks
	// Keys carries volume key requests to the controllers' VolumeKeys
	// streams; nil opens none.
	Keys *Keys
	Now  func() time.Time
}

// Agent serves nodeagentv1.NodeAgent. It is safe for concurrent use.
type Agent struct {
	nodeagentv1.UnimplementedNodeAgentServer
	cfg Config
	// key never leaves memory; cert holds what the listener presents.
	key      *ecdsa.PrivateKey
	cert     *nodeca.Keypair
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
// reconnects), so a graceful stop need not wait for them.
func (a *Agent) Shutdown() { a.stopOnce.Do(func() { close(a.stopping) }) }

// ServerTLS is the node channel's TLS 1.3: it handshakes only with a client
// presenting carve://controller from a CA in Trust.
func (a *Agent) ServerTLS() (*tls.Config, error) {
	return nodeca.ServerConfig(nodeca.Peer{Cert: a.cert, CAs: a.cfg.Trust, Now: a.cfg.Now})
}

// CopyTLS is the copy listener's TLS 1.3: it handshakes only with a node's
// certificate from a CA in Trust.
func (a *Agent) CopyTLS() (*tls.Config, error) {
	return nodeca.CopyServerConfig(nodeca.Peer{Cert: a.cert, CAs: a.cfg.Trust, Now: a.cfg.Now})
}

// Identity is the certificate the agent presents, also as a copy client.
func (a *Agent) Identity() *nodeca.Keypair { return a.cert }

// AuthorizeCopy implements nodeagentv1.NodeAgentServer.
func (a *Agent) AuthorizeCopy(ctx context.Context, req *nodeagentv1.AuthorizeCopyRequest) (*nodeagentv1.AuthorizeCopyResponse, error) {
	if a.cfg.Copies == nil {
		return nil, status.Errorf(codes.Unimplemented, "node %s serves no copies to other nodes (--node-copy-address is empty)", a.cfg.NodeName)
	}
	return a.cfg.Copies.Authorize(ctx, req)
}

// UnloggedMethods must keep their payloads out of logs: Enroll's response
// carries the node's token.
func UnloggedMethods() []string { return []string{nodeagentv1.NodeAgent_Enroll_FullMethodName} }
