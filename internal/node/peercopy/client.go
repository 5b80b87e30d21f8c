package peercopy

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/nodeca"
)

// Large flow-control windows: gRPC's default 64 KiB window starts slow.
const (
	streamWindow = 16 << 20
	connWindow   = 32 << 20
)

// Puller is the target's side: it reads a remote source from its node's
// copy port into a device. It implements provision.Puller.
type Puller struct {
	// Cert is this node's channel certificate; CAs are the CAs a source's
	// certificate must chain to.
	Cert *nodeca.Keypair
	CAs  *nodeca.Pool
	Now  func() time.Time
}

var _ provision.Puller = Puller{}

// Pull implements provision.Puller.
func (p Puller) Pull(ctx context.Context, src provision.RemoteSource, dst string, sparse bool, progress func(uint64)) (blockcopy.Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var res blockcopy.Result
	err := p.read(ctx, src, false, func(stream Receiver) error {
		var err error
		res, err = Receive(ctx, dst, src.Size, sparse, stream, progress)
		if err != nil {
			return fmt.Errorf("copy %s from node %s: %w", src.CopyID, src.Node, err)
		}
		return nil
	})
	return res, err
}

// read gives receive the stream of ReadVolume src.CopyID from src.Address,
// accepting only src.Node's certificate; ctx must be canceled after.
func (p Puller) read(ctx context.Context, src provision.RemoteSource, sentOK bool, receive func(Receiver) error) error {
	tlsCfg, err := nodeca.ClientConfig(nodeca.Peer{Cert: p.Cert, CAs: p.CAs, Now: p.Now}, src.Node)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(src.Address, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(connWindow))
	if err != nil {
		return fmt.Errorf("node %s at %s: %w", src.Node, src.Address, err)
	}
	defer func() { _ = conn.Close() }()
	stream, err := nodeagentv1.NewNodeCopyClient(conn).ReadVolume(ctx,
		&nodeagentv1.ReadVolumeRequest{CopyId: src.CopyID, AcceptsSentDigest: sentOK}, grpc.ForceCodecV2(recvCodec{}))
	if err != nil {
		return fmt.Errorf("node %s at %s: %w", src.Node, src.Address, err)
	}
	return receive(stream)
}
