//go:build guestinner

package nodeinner

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/internal/nodeca"
	"github.com/carve-csi/carve/internal/nodeca/nodecatest"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The cross-node tests run two node agents (`carve node` with the node
// channel and --node-copy-address) on volume groups of their own in one
// guest, enrolled with certificates of a test CA as carve controller
// enrolls them, and route CreateVolume through internal/controller/router as carve
// controller does: a restore or clone asked on node-b of a source on
// node-a is copied from node-a's agent over mutual TLS, on real
// device-mapper.

// crossClasses are a thick default class and a thin one on pool0.
const crossClasses = `deviceClasses:
  - name: thick
    volumeGroup: $VG
    default: true
    spare: 64Mi
  - name: thin
    volumeGroup: $VG
    thinPool: pool0
    overprovisionRatio: 4
`

// cluster is two node agents and a router over them.
type cluster struct {
	t     *testing.T
	iss   *nodeca.Issuer
	ctrl  *nodeca.Keypair
	trust *nodeca.Pool
	caPEM []byte
	nodes map[string]*agentNode
	// pvs is the PersistentVolume index: volume ID -> node.
	mu  sync.Mutex
	pvs map[string][]string
	// pvNames are the names of those PVs, by volume ID.
	pvNames map[string]string
	router  *router.Server
}

// agentNode is one node agent.
type agentNode struct {
	c                *cluster
	name, dir        string
	vg               *lvmtest.LoopVG
	log              *os.File
	channel, copying string
	plugin           *plugintest.Plugin
	conn             *grpc.ClientConn // verified, as the controller's
}

func newCluster(t *testing.T, vgSize, poolSize int64) *cluster {
	t.Helper()
	if *carveBin == "" {
		t.Fatal("-carve must name the carve binary")
	}
	if err := plugintest.LoopbackUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	ca, iss, ctrl := nodecatest.NewControllerIssuer(t)
	c := &cluster{t: t, iss: iss, ctrl: nodeca.NewKeypair(ctrl), trust: nodeca.NewPool(ca.Cert),
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}),
		nodes: map[string]*agentNode{}, pvs: map[string][]string{}}
	for _, name := range []string{"node-a", "node-b"} {
		c.nodes[name] = c.newNode(name, vgSize, poolSize)
	}
	c.router = router.New(router.Config{Nodes: c, Volumes: c, TopologyKey: topology.Key, Agents: c})
	return c
}

func (c *cluster) newNode(name string, vgSize, poolSize int64) *agentNode {
	t := c.t
	dir := t.TempDir()
	vg := lvmtest.New(t, lvmtest.Options{Dir: dir, Name: "x" + strings.TrimPrefix(name, "node-"), Size: vgSize, ExtentSize: 4 * mib, Activation: true})
	if err := vg.CreateThinPool(context.Background(), "pool0", poolSize); err != nil {
		t.Fatal(err)
	}
	logDir := *artifacts
	if logDir == "" {
		logDir = dir
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(logDir, "plugin-cross-"+t.Name()+"-"+name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	for f, data := range map[string][]byte{"ca.crt": c.caPEM, "token": []byte("a token the test does not review")} {
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n := &agentNode{c: c, name: name, dir: dir, vg: vg, log: log, channel: loopbackAddr(t), copying: loopbackAddr(t)}
	n.start()
	t.Cleanup(func() {
		n.stop()
		_ = log.Close()
	})
	return n
}

// loopbackAddr is a free 127.0.0.1 port.
func loopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// start starts the node's agent and enrolls it.
func (n *agentNode) start() {
	t := n.c.t
	t.Helper()
	p, err := plugintest.Start(context.Background(), plugintest.Options{
		Binary: *carveBin, Dir: n.dir, NodeName: n.name, Config: strings.ReplaceAll(crossClasses, "$VG", n.vg.Name),
		Env: n.vg.Env(), Log: n.log, OwnProcessGroup: true,
		ExtraArgs: []string{"--node-channel-address=" + n.channel, "--node-channel-ca-file=" + filepath.Join(n.dir, "ca.crt"),
			"--node-channel-token-file=" + filepath.Join(n.dir, "token"), "--node-copy-address=" + n.copying},
	})
	if err != nil {
		t.Fatalf("%v (plugin log: %s)", err, n.log.Name())
	}
	n.plugin = p
	n.enroll()
}

// enroll does the controller's enrollment: Enroll on a connection that
// does not verify the node, the CSR signed for the node, the certificate
// installed, then a verified connection.
func (n *agentNode) enroll() {
	t := n.c.t
	t.Helper()
	ctrl := n.c.ctrl.Current()
	first, err := grpc.NewClient(n.channel, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*ctrl}, InsecureSkipVerify: true})))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Close() }()
	agent := nodeagentv1.NewNodeAgentClient(first)
	deadline := time.Now().Add(time.Minute)
	var resp *nodeagentv1.EnrollResponse
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		resp, err = agent.Enroll(ctx, &nodeagentv1.EnrollRequest{})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Enroll %s: %v", n.name, err)
		}
		time.Sleep(500 * time.Millisecond) // the agent reads its CA file every 2 s
	}
	der, err := n.c.iss.SignNodeCSR(n.name, resp.GetCsrDer())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := agent.InstallCertificate(ctx, &nodeagentv1.InstallCertificateRequest{CertificateDer: der}); err != nil {
		t.Fatalf("InstallCertificate %s: %v", n.name, err)
	}
	cfg, err := nodeca.ClientConfig(nodeca.Peer{Cert: n.c.ctrl, CAs: n.c.trust}, n.name)
	if err != nil {
		t.Fatal(err)
	}
	if n.conn, err = grpc.NewClient(n.channel, grpc.WithTransportCredentials(credentials.NewTLS(cfg))); err != nil {
		t.Fatal(err)
	}
}

func (n *agentNode) stop() {
	if n.conn != nil {
		_ = n.conn.Close()
		n.conn = nil
	}
	if n.plugin == nil {
		return
	}
	if err := n.plugin.Stop(30 * time.Second); err != nil {
		n.c.t.Errorf("stopping %s: %v (log: %s)", n.name, err, n.log.Name())
	}
	n.plugin = nil
}

// kill kills the agent with SIGKILL: no cleanup of its own.
func (n *agentNode) kill() {
	_ = n.conn.Close()
	n.conn = nil
	if err := n.plugin.Kill(); err != nil {
		n.c.t.Errorf("killing %s: %v", n.name, err)
	}
	n.plugin = nil
}

// local is the agent's Controller service on its node channel, called
// directly (not routed).
func (n *agentNode) local() csi.ControllerClient { return csi.NewControllerClient(n.conn) }

// Controller, Names, NodesOf, NodeAgent and Host make the cluster the
// router's Nodes, Locator and Agents.
func (c *cluster) Controller(_ context.Context, node string) (csi.ControllerClient, error) {
	n, ok := c.nodes[node]
	if !ok || n.conn == nil {
		return nil, fmt.Errorf("node %s: %w", node, router.ErrUnreachable)
	}
	return csi.NewControllerClient(n.conn), nil
}

func (c *cluster) Names() []string { return []string{"node-a", "node-b"} }

func (c *cluster) NodesOf(handle string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pvs[handle], nil
}

// PVsOf names the PV of each volume a test made with a PV: the volume's
// own name, as csi-provisioner names it.
func (c *cluster) PVsOf(handle string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.pvNames[handle]; ok {
		return []string{n}, nil
	}
	return nil, nil
}

func (c *cluster) NodeAgent(_ context.Context, node string) (nodeagentv1.NodeAgentClient, error) {
	n, ok := c.nodes[node]
	if !ok || n.conn == nil {
		return nil, fmt.Errorf("node %s: %w", node, router.ErrUnreachable)
	}
	return nodeagentv1.NewNodeAgentClient(n.conn), nil
}

func (c *cluster) Host(string) (string, error) { return "127.0.0.1", nil }

// source makes a volume of class on node-a of size bytes, writes data
// into it (a chunk every stride bytes, chunk bytes each), records its PV,
// and returns its ID and the SHA-256 of its size bytes.
func (c *cluster) source(name, class string, size, chunk, stride int64) (string, [32]byte) {
	t := c.t
	t.Helper()
	a := c.nodes["node-a"]
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	v, err := a.local().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")}, Parameters: map[string]string{"carve.dev/device-class": class}})
	if err != nil {
		t.Fatalf("CreateVolume %s on node-a: %v", name, err)
	}
	id := v.GetVolume().GetVolumeId()
	c.mu.Lock()
	c.pvs[id] = []string{"node-a"}
	if c.pvNames == nil {
		c.pvNames = map[string]string{}
	}
	c.pvNames[id] = name
	c.mu.Unlock()
	dev := plugintest.MustDevicePath(t, id)
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := fill(chunk, name)
	for off := int64(0); off+chunk <= size; off += stride {
		if _, err := f.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return id, hashDevice(t, dev, size)
}

// fill is n bytes that are not zeros, different for each seed (cheaper
// than random bytes under emulation).
func fill(n int64, seed string) []byte {
	b := make([]byte, n)
	s := uint32(len(seed)) * 2654435761
	for _, r := range seed {
		s = s*31 + uint32(r)
	}
	for i := range b {
		s = s*1664525 + 1013904223
		b[i] = byte(s>>24) | 1
	}
	return b
}

// restore asks the router for a volume of class on node-b from src.
func (c *cluster) restore(ctx context.Context, name, class string, size int64, src *csi.VolumeContentSource) (string, error) {
	v, err := c.router.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")}, Parameters: map[string]string{"carve.dev/device-class": class},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{&csi.Topology{Segments: topology.Segments("node-b")}},
			Preferred: []*csi.Topology{&csi.Topology{Segments: topology.Segments("node-b")}}},
		VolumeContentSource: src})
	if err != nil {
		return "", err
	}
	if got := v.GetVolume().GetAccessibleTopology(); len(got) != 1 || got[0].GetSegments()[topology.Key] != "node-b" {
		return "", fmt.Errorf("the volume is on %v, not node-b", got)
	}
	return v.GetVolume().GetVolumeId(), nil
}

// restoreRetrying is restore retried as csi-provisioner retries, until it
// succeeds or the deadline.
func (c *cluster) restoreRetrying(name, class string, size int64, src *csi.VolumeContentSource) string {
	t := c.t
	t.Helper()
	deadline := time.Now().Add(8 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		id, err := c.restore(ctx, name, class, size, src)
		cancel()
		if err == nil {
			return id
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restore %s did not converge: %v", name, err)
		}
		t.Logf("retrying %s after %s: %v", name, status.Code(err), err)
		time.Sleep(2 * time.Second)
	}
}

// checkCopy checks that node-b's volume id holds want in its first size
// bytes and carries no copy-pending tag.
func (c *cluster) checkCopy(id string, size int64, want [32]byte) {
	t := c.t
	t.Helper()
	dev := plugintest.MustDevicePath(t, id)
	if got := hashDevice(t, dev, size); got != want {
		t.Errorf("%s: SHA-256 %x, the source's %x", id, got, want)
	}
	b := c.nodes["node-b"]
	out, err := b.vg.LVM(context.Background(), "lvs", "--noheadings", "-o", "lv_tags", id)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), volume.TagCopyPending) {
		t.Errorf("%s still carries %s: %s", id, volume.TagCopyPending, out)
	}
}

// snapshotOnA takes a snapshot of node-a's volume id.
func (c *cluster) snapshotOnA(name, id string) string {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	s, err := c.nodes["node-a"].local().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: id})
	if err != nil {
		t.Fatalf("CreateSnapshot %s: %v", name, err)
	}
	return s.GetSnapshot().GetSnapshotId()
}

// TestCrossNodeCopy: a restore on node-b of a snapshot on node-a, and a
// clone of a volume on node-a, hold the source's bytes (SHA-256) for
// every pairing of thin and thick source and target. 32 MiB, 3 MiB of
// data every 8 MiB: data and zeros at every offset a copy can get wrong
// (both ends of a run, the gaps, the end), in a size that copies quickly
// under emulation.
func TestCrossNodeCopy(t *testing.T) {
	c := newCluster(t, 1536*mib, 768*mib)
	const size = 32 * mib
	for _, k := range []struct{ from, to string }{{"thin", "thin"}, {"thick", "thin"}, {"thin", "thick"}, {"thick", "thick"}} {
		kind := k.from + "-" + k.to
		t.Run(kind, func(t *testing.T) {
			id, want := c.source("src-"+kind, k.from, size, 3*mib, 8*mib)
			snap := c.snapshotOnA("snap-"+kind, id)
			start := time.Now()
			rid := c.restoreRetrying("restored-"+kind, k.to, size, snapshotSource(snap))
			t.Logf("restore %s: %s", kind, time.Since(start).Round(time.Millisecond))
			c.checkCopy(rid, size, want)
			cid := c.restoreRetrying("cloned-"+kind, k.to, size, volumeSource(id))
			c.checkCopy(cid, size, want)
		})
	}
}

// waitCopying waits until node-b has an LV tagged copy-pending.
func (c *cluster) waitCopying(timeout time.Duration) string {
	t := c.t
	t.Helper()
	b := c.nodes["node-b"]
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		out, err := b.vg.LVM(context.Background(), "lvs", "--noheadings", "-o", "lv_name,lv_tags", b.vg.Name)
		if err == nil {
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, volume.TagCopyPending) {
					return strings.Fields(line)[0]
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no copy started on node-b")
	return ""
}

// TestCrossNodeCopyKilled: the target's agent, then the source's, killed
// in the middle of a copy, and the controller gone (its call canceled):
// the retry copies again (or, after the controller, finds the copy that
// went on without it) and the volume holds the source's bytes.
func TestCrossNodeCopyKilled(t *testing.T) {
	// A copy into a thin class needs the source's size free in the pool:
	// room for three.
	c := newCluster(t, 2048*mib, 1280*mib)
	// Big enough that the copy is still going 300 ms after it started
	// under emulation (the log says when it was not).
	const size = 128 * mib
	id, want := c.source("src-killed", "thick", size, 4*mib, 6*mib)
	snap := c.snapshotOnA("snap-killed", id)
	for _, victim := range []string{"node-b", "node-a", "controller"} {
		t.Run("kill "+victim, func(t *testing.T) {
			name := "killed-" + victim
			done := make(chan error, 1)
			ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
			defer cancel()
			go func() {
				_, err := c.restore(ctx, name, "thin", size, snapshotSource(snap))
				done <- err
			}()
			lv := c.waitCopying(2 * time.Minute)
			time.Sleep(300 * time.Millisecond)
			n := c.nodes[victim]
			if n != nil {
				n.kill()
			} else {
				cancel()
			}
			t.Logf("killed %s while %s was being copied", victim, lv)
			if err := <-done; err == nil {
				t.Log("the copy finished before the kill took effect")
			} else {
				t.Logf("the interrupted CreateVolume: %v", err)
			}
			if n != nil {
				n.start()
			}
			rid := c.restoreRetrying(name, "thin", size, snapshotSource(snap))
			c.checkCopy(rid, size, want)
		})
	}
}

// TestBenchCrossNodeCopy measures a restore on node-b of a 1 GiB
// snapshot on node-a that is half data, against dd of the source device
// to /dev/null (the read limit) in the same guest. It prints the figures;
// it asserts only that the copy is whole. A TestBench: `make bench` runs
// it (TestBenchPlugin), TestPluginNode does not.
func TestBenchCrossNodeCopy(t *testing.T) {
	c := newCluster(t, 3072*mib, 1536*mib)
	const size = 1024 * mib
	id, want := c.source("src-tput", "thick", size, 4*mib, 8*mib)
	snap := c.snapshotOnA("snap-tput", id)
	dev := plugintest.MustDevicePath(t, id)
	for i := range 1 {
		start := time.Now()
		out, err := exec.CommandContext(context.Background(), "dd", "if="+dev, "of=/dev/null", "bs=4M", "iflag=direct").CombinedOutput()
		if err != nil {
			t.Fatalf("dd: %v: %s", err, out)
		}
		dd := time.Since(start)
		start = time.Now()
		rid := c.restoreRetrying(fmt.Sprintf("tput-%d", i), "thin", size, snapshotSource(snap))
		cp := time.Since(start)
		c.checkCopy(rid, size, want)
		ddRate, cpRate := float64(size/mib)/dd.Seconds(), float64(size/mib)/cp.Seconds()
		fmt.Printf("CROSSNODE copy of a 1 GiB volume, 50%% data, thick -> thin: %.1f MiB/s (%s); dd of the source: %.1f MiB/s (%s); ratio %.2f\n",
			cpRate, cp.Round(time.Millisecond), ddRate, dd.Round(time.Millisecond), cpRate/ddRate)
	}
}
