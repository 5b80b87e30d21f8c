package main

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/csiserver"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/nodeca/nodecatest"
)

// stubReporter is an lvm that always reports r.
type stubReporter struct{ r *lvm.Report }

func (s stubReporter) Report(context.Context, ...string) (*lvm.Report, error) { return s.r, nil }

// freeAddr is a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestNodeChannel: the node channel serves the plugin's Identity and
// Controller servers and NodeAgent (not Node) over TLS, only once the CA
// bundle it waits for exists, through the socket's metrics; it stops
// promptly with a capacity stream open.
func TestNodeChannel(t *testing.T) {
	ca, _, ctrl := nodecatest.NewControllerIssuer(t)
	dir := t.TempDir()
	o := &NodeOptions{CommonOptions: CommonOptions{DriverName: DefaultDriverName}, NodeName: "node-a",
		NodeChannel: NodeChannelOptions{Address: freeAddr(t), CAFile: filepath.Join(dir, "ca.crt"), TokenFile: filepath.Join(dir, "token")}}
	cfg := &deviceclass.Config{DeviceClasses: []deviceclass.DeviceClass{{Name: "fast", VolumeGroup: "vg1", Default: true}}}
	view := vgview.New(stubReporter{&lvm.Report{VolumeGroups: []lvm.VolumeGroup{{Name: "vg1", Size: 10 << 30, Free: 8 << 30, ExtentSize: 4 << 20}}}}, cfg, nil)
	if err := view.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	mm := newMetricsManager(DefaultDriverName, "node")
	svc := csiserver.Services{
		Identity:   csiserver.NewIdentityServer(csiserver.IdentityConfig{Name: DefaultDriverName, Version: "test"}),
		Controller: csiserver.ResizerOnlyController{},
		Node:       csiserver.ResizerOnlyNode{},
	}
	run, err := nodeChannel(o, cfg, view, nil, svc, mm, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()

	// The enrollment connection's TLS: the controller's certificate, the
	// node's not verified.
	creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*ctrl}, InsecureSkipVerify: true})
	connect := func() *grpc.ClientConn {
		conn, err := grpc.NewClient(o.NodeChannel.Address, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	probe := func() error {
		_, err := csi.NewIdentityClient(connect()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		return err
	}
	// Listening, but trusting no CA yet.
	deadline := time.Now().Add(10 * time.Second)
	for err := probe(); status.Code(err) != codes.Unavailable || err == nil; err = probe() {
		if err == nil {
			t.Fatal("served before any CA bundle existed")
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node channel does not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := os.WriteFile(o.NodeChannel.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for err := probe(); err != nil; err = probe() {
		if time.Now().After(deadline) {
			t.Fatalf("the CA bundle written is not trusted: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	conn := connect()
	calls := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"Identity", func() error {
			_, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
			return err
		}, codes.OK},
		{"Controller", func() error {
			_, err := csi.NewControllerClient(conn).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
			return err
		}, codes.OK},
		{"NodeAgent", func() error {
			_, err := nodeagentv1.NewNodeAgentClient(conn).Inventory(ctx, &nodeagentv1.InventoryRequest{})
			return err
		}, codes.OK},
		{"no Node service", func() error {
			_, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
			return err
		}, codes.Unimplemented},
	}
	for _, c := range calls {
		if err := c.call(); status.Code(err) != c.want {
			t.Errorf("%s: %v, want code %s", c.name, err, c.want)
		}
	}
	if n, err := testutil.GatherAndCount(mm.GetRegistry(), "csi_plugin_operations_seconds"); err != nil || n < 3 {
		t.Errorf("%d csi_plugin_operations_seconds series (err %v), want one per method called", n, err)
	}

	stream, err := nodeagentv1.NewNodeAgentClient(conn).WatchCapacity(ctx, &nodeagentv1.WatchCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || len(r.GetClasses()) != 1 || r.GetClasses()[0].GetAvailableBytes() != 8<<30 {
		t.Fatalf("capacity report %v, err %v", r, err)
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the node channel stopped with %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("stopping took %s with a capacity stream open", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the node channel did not stop")
	}
}

// TestNodeChannelAddressInUse: a port that cannot be had fails the plugin
// with the flag named.
func TestNodeChannelAddressInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	dir := t.TempDir()
	o := &NodeOptions{NodeName: "node-a", NodeChannel: NodeChannelOptions{Address: l.Addr().String(),
		CAFile: filepath.Join(dir, "ca.crt"), TokenFile: filepath.Join(dir, "token")}}
	cfg := &deviceclass.Config{}
	view := vgview.New(stubReporter{&lvm.Report{}}, cfg, nil)
	run, err := nodeChannel(o, cfg, view, nil, csiserver.Services{}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t.Context()); err == nil || !strings.Contains(err.Error(), "--node-channel-address "+l.Addr().String()) {
		t.Errorf("run: %v, want the flag named", err)
	}
}
