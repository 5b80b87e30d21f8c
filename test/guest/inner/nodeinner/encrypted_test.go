//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/pvindex"
	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/internal/controller/volumekey"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The encrypted-volume test runs node-a's agent (`carve node` with the
// node channel) and plays carve controller with the real router (which
// makes and wraps each volume's key) and the real key releaser
// (internal/controller/volumekey) on a VolumeKeys stream it opens to the
// agent, as the controller's pool does. The agent runs cryptsetup on
// real dm-crypt.

// memRing is the controller's keyring, held in memory; the test swaps it
// as a rotation does.
type memRing struct {
	mu sync.Mutex
	r  *volumekey.Keyring
}

func (k *memRing) Keyring(context.Context) (*volumekey.Keyring, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.r, nil
}
func (k *memRing) Reload(ctx context.Context) (*volumekey.Keyring, error) { return k.Keyring(ctx) }

func (k *memRing) set(keks map[string][]byte) error {
	r, err := volumekey.NewKeyring(keks)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.r = r
	return nil
}

// keyHolders is the PV index the releaser reads: the PVs the test made.
type keyHolders struct {
	mu sync.Mutex
	m  map[string][]pvindex.Holder
}

func (h *keyHolders) HoldersOf(id string) ([]pvindex.Holder, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m[id], nil
}

func (h *keyHolders) set(id string, hs ...pvindex.Holder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.m[id] = hs
}

// serveKeys answers node's key requests with answer until ctx ends.
func serveKeys(ctx context.Context, t *testing.T, n *agentNode, answer func(*nodeagentv1.VolumeKeyRequest) *nodeagentv1.VolumeKeyAnswer) {
	stream, err := nodeagentv1.NewNodeAgentClient(n.conn).VolumeKeys(ctx)
	if err != nil {
		t.Fatalf("VolumeKeys: %v", err)
	}
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				return
			}
			if stream.Send(answer(req)) != nil {
				return
			}
		}
	}()
}

var luksPattern = bytes.Repeat([]byte("CARVE-LUKS-PLAINTEXT-PATTERN-0123456789-"), 1<<14) // 640 KiB

// containsPattern tells whether the device at path holds a 40-byte
// piece of luksPattern anywhere in its first n bytes.
func containsPattern(t *testing.T, path string, n int64) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read-only
	needle := luksPattern[:40]
	buf := make([]byte, 4*mib+int64(len(needle)))
	var off int64
	for off < n {
		k, err := f.ReadAt(buf, off)
		if bytes.Contains(buf[:k], needle) {
			return true
		}
		if err == io.EOF || k == 0 {
			return false
		}
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		off += 4 * mib
	}
	return false
}

// loadDMCrypt loads the dm_crypt module the encrypted volumes need.
func loadDMCrypt(t *testing.T) {
	t.Helper()
	if out, err := exec.CommandContext(context.Background(), "modprobe", "dm_crypt").CombinedOutput(); err != nil {
		t.Fatalf("modprobe dm_crypt: %v: %s", err, out)
	}
}

// newKeyService is the controller's side of volume keys over c: a ring
// holding one new key-encryption key (kek, as "1"), the nodes' key
// holders, the releaser over both, and the router that makes and wraps
// each volume's key with the ring.
func newKeyService(t *testing.T, c *cluster) (kek []byte, ring *memRing, holders *keyHolders, rel *volumekey.Releaser, rt *router.Server) {
	t.Helper()
	kek = make([]byte, volumekey.KeySize)
	if _, err := rand.Read(kek); err != nil {
		t.Fatal(err)
	}
	ring = &memRing{}
	if err := ring.set(map[string][]byte{"1": kek}); err != nil {
		t.Fatal(err)
	}
	holders = &keyHolders{m: map[string][]pvindex.Holder{}}
	rel, err := volumekey.NewReleaser(ring, holders, nil)
	if err != nil {
		t.Fatal(err)
	}
	rt = router.New(router.Config{Nodes: c, Volumes: c, TopologyKey: topology.Key, Agents: c, Keys: ring})
	return kek, ring, holders, rel, rt
}

// TestEncryptedVolume: a volume of a class with carve.dev/encryption:
// luks2, end to end on real dm-crypt: the router makes and wraps its key,
// the agent formats the LV with LUKS2, NodeStageVolume opens it with the
// key the releaser gives node-a and makes the filesystem on the opened
// device; a pattern written through it is absent from the raw LV (and
// present in the opened device: the check can see it); a refused key and
// a wrong key fail the stage without formatting (the data is still there
// after); NodeUnstageVolume closes the device; DeleteVolume crypto-erases
// it: its header on the freed extents opens with the key no more. The
// crypto-erase is timed against zeroing the same size.
func TestEncryptedVolume(t *testing.T) {
	loadDMCrypt(t)
	const size, grown = 256 * mib, 320 * mib
	c := newCluster(t, size+256*mib, 64*mib)
	a := c.nodes["node-a"]
	kek, ring, holders, rel, rt := newKeyService(t, c)

	// The controller's answers: the releaser's, unless the test makes it
	// hand out a wrong key.
	var wrongKey sync.Mutex
	wrong := false
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	serveKeys(ctx, t, a, func(r *nodeagentv1.VolumeKeyRequest) *nodeagentv1.VolumeKeyAnswer {
		wrongKey.Lock()
		defer wrongKey.Unlock()
		if wrong {
			k := make([]byte, 32)
			_, _ = rand.Read(k)
			return &nodeagentv1.VolumeKeyAnswer{RequestId: r.GetRequestId(), Key: k}
		}
		return rel.Answer(ctx, "node-a", r)
	})

	rctx, rcancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer rcancel()
	params := map[string]string{volume.ParamDeviceClass: "thick", volume.ParamEncryption: volume.EncryptionLUKS2}
	v, err := rt.CreateVolume(rctx, &csi.CreateVolumeRequest{Name: "pvc-enc", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")}, Parameters: params,
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: topology.Segments("node-a")}}}})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	id, vctx := v.GetVolume().GetVolumeId(), v.GetVolume().GetVolumeContext()
	keyID := vctx[volume.ContextKeyID]
	if keyID != volumekey.KeyIDFor("pvc-enc") || vctx[volume.ParamEncryption] != volume.EncryptionLUKS2 {
		t.Fatalf("volume context %v", vctx)
	}
	holders.set(id, pvindex.Holder{PV: "pvc-enc", Node: "node-a", KeyID: keyID})
	c.mu.Lock()
	c.pvs[id] = []string{"node-a"}
	c.mu.Unlock()
	raw := plugintest.MustDevicePath(t, id)
	vol, _ := volume.ParseID(id)
	mapper := "/dev/mapper/" + volume.MapperName(vol.LV)

	node := csi.NewNodeClient(a.plugin.Conn)
	staging := filepath.Join(t.TempDir(), "staging")
	stage := func() error {
		sctx, scancel := context.WithTimeout(context.Background(), rpcTimeout)
		defer scancel()
		_, err := node.NodeStageVolume(sctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: plugintest.MountCapability("ext4"), VolumeContext: vctx})
		return err
	}
	unstage := func() {
		t.Helper()
		sctx, scancel := context.WithTimeout(context.Background(), rpcTimeout)
		defer scancel()
		if _, err := node.NodeUnstageVolume(sctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
		if _, err := os.Stat(mapper); !os.IsNotExist(err) {
			t.Fatalf("%s is still there after unstage (%v)", mapper, err)
		}
	}

	if err := stage(); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	file := filepath.Join(staging, "pattern")
	writeSynced(t, file, luksPattern)
	// The page cache must not answer the checks: drop it.
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		t.Logf("drop_caches: %v", err)
	}
	if !containsPattern(t, mapper, size) {
		t.Fatal("the opened device does not hold the pattern written through it: the check below could not fail")
	}
	if containsPattern(t, raw, size) {
		t.Fatal("the raw LV holds the plaintext pattern")
	}
	t.Logf("the pattern is in %s and not in the raw LV %s", mapper, raw)
	// Online expansion through the LUKS layer: the LV, the opened device,
	// then the filesystem.
	before := fsSize(t, staging)
	ectx, ecancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer ecancel()
	if _, err := node.NodeExpandVolume(ectx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: staging,
		CapacityRange: &csi.CapacityRange{RequiredBytes: grown}, VolumeCapability: plugintest.MountCapability("ext4")}); err != nil {
		t.Fatalf("NodeExpandVolume: %v", err)
	}
	if after := fsSize(t, staging); after < before+48*mib {
		t.Fatalf("the filesystem grew from %d to %d bytes; want about 64 MiB more", before, after)
	} else {
		t.Logf("expanded online through LUKS: filesystem %d -> %d bytes", before, after)
	}
	unstage()

	// Refused: the PV index records another key ID for the volume.
	holders.set(id, pvindex.Holder{PV: "pvc-enc", Node: "node-a", KeyID: volumekey.KeyIDFor("pvc-other")})
	if err := stage(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), id) {
		t.Fatalf("stage with the key refused = %v, want FAILED_PRECONDITION naming %s", err, id)
	}
	// Refused: another node's volume.
	holders.set(id, pvindex.Holder{PV: "pvc-enc", Node: "node-b", KeyID: keyID})
	if err := stage(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stage of a volume the index puts on node-b = %v, want FAILED_PRECONDITION", err)
	}
	holders.set(id, pvindex.Holder{PV: "pvc-enc", Node: "node-a", KeyID: keyID})
	// A wrong key opens no keyslot.
	wrongKey.Lock()
	wrong = true
	wrongKey.Unlock()
	if err := stage(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "opens no keyslot") {
		t.Fatalf("stage with a wrong key = %v, want FAILED_PRECONDITION (no keyslot)", err)
	}
	wrongKey.Lock()
	wrong = false
	wrongKey.Unlock()
	// Nothing was formatted: the file is still there.
	if err := stage(); err != nil {
		t.Fatalf("NodeStageVolume after the refusals: %v", err)
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, luksPattern) {
		t.Fatalf("after the refused stages the file reads %d bytes, %v: the volume was formatted", len(got), err)
	}
	unstage()

	// A rotation: KEK 2 joins; the next stage rewraps the volume's key
	// under it in the header; with KEK 1 gone the volume still opens.
	kek2 := make([]byte, volumekey.KeySize)
	if _, err := rand.Read(kek2); err != nil {
		t.Fatal(err)
	}
	if err := ring.set(map[string][]byte{"1": kek, "2": kek2}); err != nil {
		t.Fatal(err)
	}
	if err := stage(); err != nil {
		t.Fatalf("NodeStageVolume after the rotation: %v", err)
	}
	unstage()
	tokAfter, err := exec.CommandContext(context.Background(), "cryptsetup", "token", "export", "--token-id", "0", raw).Output()
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := luks.ParseToken(tokAfter); err != nil || !strings.HasPrefix(tok.Wrapped, "carve1.2.") || tok.KeyID != keyID {
		t.Fatalf("the header's token after the rotation: %+v, %v; want the key wrapped under KEK 2", tok, err)
	}
	if err := ring.set(map[string][]byte{"2": kek2}); err != nil {
		t.Fatal(err)
	}
	if err := stage(); err != nil {
		t.Fatalf("NodeStageVolume with KEK 1 dropped: %v", err)
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, luksPattern) {
		t.Fatalf("after the rotation the file reads %d bytes, %v", len(got), err)
	}
	m, err := a.plugin.Scrape(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for result, want := range map[string]float64{"opened": 4, "refused": 2, "wrong_key": 1} {
		if got, _, _ := m.Counter("carve_encrypted_volume_opens_total", map[string]string{"result": result}); got != want {
			t.Errorf("carve_encrypted_volume_opens_total{result=%q} = %v, want %v", result, got, want)
		}
	}
	// The agent restarted while the volume is staged: the opened device
	// and the mount are the kernel's and stay; a repeated stage finds
	// them and asks for no key (no stream is open to the new agent).
	cancel()
	a.stop()
	a.start()
	node = csi.NewNodeClient(a.plugin.Conn)
	if err := stage(); err != nil {
		t.Fatalf("NodeStageVolume after the agent's restart: %v", err)
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, luksPattern) {
		t.Fatalf("after the agent's restart the file reads %d bytes, %v", len(got), err)
	}
	unstage()

	// The key, as the releaser gives it, for the check after the delete.
	tokOut, err := exec.CommandContext(context.Background(), "cryptsetup", "token", "export", "--token-id", "0", raw).Output()
	if err != nil {
		t.Fatal(err)
	}
	ans := rel.Answer(context.Background(), "node-a", tokenRequest(t, id, tokOut))
	if len(ans.GetKey()) == 0 {
		t.Fatalf("the releaser refused the key: %s", ans.GetRefused())
	}
	opens := func(dev string) bool {
		cmd := exec.CommandContext(context.Background(), "cryptsetup", "open", "--test-passphrase", "--key-file", "-", dev)
		cmd.Stdin = bytes.NewReader(ans.GetKey())
		return cmd.Run() == nil
	}
	if !opens(raw) {
		t.Fatal("the volume's key does not open its header before the delete: the check below could not fail")
	}

	start := time.Now()
	dctx, dcancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer dcancel()
	if _, err := rt.DeleteVolume(dctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	deleteTook := time.Since(start)
	// The freed extents, as an LV that neither zeroes nor wipes them.
	if out, err := a.vg.LVM(context.Background(), "lvcreate", "--yes", "-Zn", "-Wn", "-L", fmt.Sprintf("%dm", grown/mib), "-n", "after", a.vg.Name); err != nil {
		t.Fatalf("lvcreate on the freed extents: %v: %s", err, out)
	}
	after := "/dev/" + a.vg.Name + "/after"
	if opens(after) {
		t.Fatal("the deleted volume's header still opens with its key")
	}
	if containsPattern(t, after, grown) {
		t.Fatal("the freed extents hold the plaintext pattern")
	}
	// What a plain volume's erasure costs on the same size.
	start = time.Now()
	if _, err := erase.Device(context.Background(), after, erase.ZeroOut); err != nil {
		t.Fatalf("zeroing %s: %v", after, err)
	}
	zeroTook := time.Since(start)
	fmt.Printf("CRYPTO-ERASE size %d MiB: DeleteVolume with luksErase %s, zeroing the same size (BLKZEROOUT) %s\n",
		grown/mib, deleteTook.Round(time.Millisecond), zeroTook.Round(time.Millisecond))
}

// tokenRequest is the request the agent would make from a token's JSON.
func tokenRequest(t *testing.T, id string, j []byte) *nodeagentv1.VolumeKeyRequest {
	t.Helper()
	tok, err := luks.ParseToken(j)
	if err != nil {
		t.Fatal(err)
	}
	return &nodeagentv1.VolumeKeyRequest{RequestId: 1, VolumeId: id, KeyId: tok.KeyID, WrappedKey: tok.Wrapped}
}

// TestEncryptedRestoreOnAnotherNode: a snapshot of an encrypted volume on
// node-a restored on node-b (a copy across nodes, as a move's seed is)
// carries the ciphertext and its header: the restore records the
// source's key ID, node-b opens it with the key the releaser gives node-b
// for it, and reads the file written on node-a. A plain restore of the
// same snapshot is INVALID_ARGUMENT naming the parameter.
func TestEncryptedRestoreOnAnotherNode(t *testing.T) {
	loadDMCrypt(t)
	const size = 64 * mib
	c := newCluster(t, 512*mib, 64*mib)
	_, _, holders, rel, rt := newKeyService(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, n := range []string{"node-a", "node-b"} {
		serveKeys(ctx, t, c.nodes[n], func(r *nodeagentv1.VolumeKeyRequest) *nodeagentv1.VolumeKeyAnswer {
			return rel.Answer(ctx, n, r)
		})
	}
	params := map[string]string{volume.ParamDeviceClass: "thick", volume.ParamEncryption: volume.EncryptionLUKS2}
	create := func(name, node string, params map[string]string, src *csi.VolumeContentSource) (*csi.Volume, error) {
		deadline := time.Now().Add(5 * time.Minute)
		for {
			rctx, rcancel := context.WithTimeout(context.Background(), rpcTimeout)
			v, err := rt.CreateVolume(rctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
				VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")}, Parameters: params, VolumeContentSource: src,
				AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: topology.Segments(node)}},
					Preferred: []*csi.Topology{{Segments: topology.Segments(node)}}}})
			rcancel()
			switch code := status.Code(err); {
			case err == nil:
				id := v.GetVolume().GetVolumeId()
				holders.set(id, pvindex.Holder{PV: name, Node: node, KeyID: v.GetVolume().GetVolumeContext()[volume.ContextKeyID]})
				c.mu.Lock()
				c.pvs[id] = []string{node}
				c.mu.Unlock()
				return v.GetVolume(), nil
			case (code == codes.Aborted || code == codes.Unavailable) && time.Now().Before(deadline):
				time.Sleep(2 * time.Second)
			default:
				return nil, err
			}
		}
	}
	stage := func(n *agentNode, v *csi.Volume, staging string) {
		t.Helper()
		sctx, scancel := context.WithTimeout(context.Background(), rpcTimeout)
		defer scancel()
		if _, err := csi.NewNodeClient(n.plugin.Conn).NodeStageVolume(sctx, &csi.NodeStageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging,
			VolumeCapability: plugintest.MountCapability("ext4"), VolumeContext: v.GetVolumeContext()}); err != nil {
			t.Fatalf("NodeStageVolume of %s on %s: %v", v.GetVolumeId(), n.name, err)
		}
	}
	unstage := func(n *agentNode, v *csi.Volume, staging string) {
		t.Helper()
		sctx, scancel := context.WithTimeout(context.Background(), rpcTimeout)
		defer scancel()
		if _, err := csi.NewNodeClient(n.plugin.Conn).NodeUnstageVolume(sctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume of %s on %s: %v", v.GetVolumeId(), n.name, err)
		}
	}

	src, err := create("pvc-src", "node-a", params, nil)
	if err != nil {
		t.Fatalf("CreateVolume on node-a: %v", err)
	}
	stagingA := filepath.Join(t.TempDir(), "a")
	stage(c.nodes["node-a"], src, stagingA)
	writeSynced(t, filepath.Join(stagingA, "pattern"), luksPattern)
	unstage(c.nodes["node-a"], src, stagingA)
	snap := c.snapshotOnA("snap-enc", src.GetVolumeId())

	restored, err := create("pvc-restored", "node-b", params, snapshotSource(snap))
	if err != nil {
		t.Fatalf("encrypted restore on node-b: %v", err)
	}
	if got, want := restored.GetVolumeContext()[volume.ContextKeyID], src.GetVolumeContext()[volume.ContextKeyID]; got != want || got == "" {
		t.Fatalf("the restore records key ID %q; its source's is %q", got, want)
	}
	stagingB := filepath.Join(t.TempDir(), "b")
	stage(c.nodes["node-b"], restored, stagingB)
	if got, err := os.ReadFile(filepath.Join(stagingB, "pattern")); err != nil || !bytes.Equal(got, luksPattern) {
		t.Fatalf("node-b reads %d bytes of the file, %v", len(got), err)
	}
	raw := plugintest.MustDevicePath(t, restored.GetVolumeId())
	if containsPattern(t, raw, size) {
		t.Fatal("node-b's raw LV holds the plaintext pattern")
	}
	unstage(c.nodes["node-b"], restored, stagingB)

	_, err = create("pvc-plain", "node-b", map[string]string{volume.ParamDeviceClass: "thick"}, snapshotSource(snap))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), volume.ParamEncryption) {
		t.Fatalf("a plain restore of the encrypted snapshot = %v, want INVALID_ARGUMENT naming %s", err, volume.ParamEncryption)
	}
}
