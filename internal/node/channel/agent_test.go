package channel

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/nodeca"
)

const (
	gi   = int64(1) << 30
	ex   = uint64(4) << 20
	node = "node-a"
)

// env is an agent over a real volume-group view, with carve's CA and a
// CA nobody trusts.
type env struct {
	ca, other     *nodeca.CA
	iss, otherIss *nodeca.Issuer
	trust         *nodeca.Pool
	lvm           *provisiontest.LVM
	view          *vgview.View
	agent         *Agent
	tokenFile     string
}

func testClasses() *deviceclass.Config {
	return &deviceclass.Config{DeviceClasses: []deviceclass.DeviceClass{
		{Name: "thick", VolumeGroup: "vg1", Default: true},
		{Name: "thin", VolumeGroup: "vg1", ThinPool: "pool", OverprovisionRatio: 2},
		{Name: "gone", VolumeGroup: "vg2"},
	}}
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{}
	var err error
	for _, ca := range []**nodeca.CA{&e.ca, &e.other} {
		if *ca, err = nodeca.NewCA(nodeca.CAOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if e.iss, err = nodeca.NewIssuer(e.ca, nodeca.IssuerOptions{}); err != nil {
		t.Fatal(err)
	}
	if e.otherIss, err = nodeca.NewIssuer(e.other, nodeca.IssuerOptions{}); err != nil {
		t.Fatal(err)
	}
	e.trust = nodeca.NewPool(e.ca.Cert)
	e.lvm = provisiontest.NewLVM()
	e.lvm.SetReport(lvm.Report{
		VolumeGroups: []lvm.VolumeGroup{{Name: "vg1", Size: 20 * uint64(gi), Free: 10 * uint64(gi), ExtentSize: ex}},
		LogicalVolumes: []lvm.LogicalVolume{
			{Name: "pool", VolumeGroup: "vg1", Size: 4 * uint64(gi), Attr: lvm.Attributes{Type: lvm.TypeThinPool}},
		},
		ThinPools: []lvm.ThinPool{{Name: "pool", VolumeGroup: "vg1", Size: 4 * uint64(gi)}},
	})
	e.view = vgview.New(e.lvm, testClasses(), nil)
	if err := e.view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.tokenFile = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(e.tokenFile, []byte("eyJhbGciOi.token.sig"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.agent, err = New(Config{NodeName: node, TokenFile: e.tokenFile, Trust: e.trust, Classes: testClasses(),
		Capacity: e.view, Inventory: e.view, Keys: NewKeys()})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// serve serves the agent on loopback with its TLS, as the plugin does.
func (e *env) serve(t *testing.T) string {
	t.Helper()
	cfg, err := e.agent.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	nodeagentv1.RegisterNodeAgentServer(srv, e.agent)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// enrollTLS is how the controller dials a node to enroll it: with its
// certificate, not verifying the node's (the token proves the node).
func enrollTLS(cert *tls.Certificate) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert},
		InsecureSkipVerify: true}
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) nodeagentv1.NodeAgentClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return nodeagentv1.NewNodeAgentClient(conn)
}

func mustCtrl(t *testing.T, iss *nodeca.Issuer) *tls.Certificate {
	t.Helper()
	c, err := iss.IssueController()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewRefuses(t *testing.T) {
	e := newEnv(t)
	valid := Config{NodeName: node, TokenFile: e.tokenFile, Trust: e.trust, Classes: testClasses(), Capacity: e.view, Inventory: e.view}
	tests := []struct {
		name string
		mod  func(c *Config)
		want string
	}{
		{"bad node name", func(c *Config) { c.NodeName = "Node_A" }, "DNS-1123"},
		{"no token file", func(c *Config) { c.TokenFile = "" }, "no token file"},
		{"no trust", func(c *Config) { c.Trust = nil }, "trust pool"},
		{"no view", func(c *Config) { c.Capacity = nil }, "sources are required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.mod(&c)
			if _, err := New(c); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
