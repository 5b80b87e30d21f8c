//go:build nodes

package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/internal/controller/volumekey"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// encryptedClass makes a StorageClass like thickSC whose volumes are
// LUKS2 devices.
func encryptedClass(t *testing.T, ctx context.Context, ns string) string {
	t.Helper()
	return kubetest.ClassLike(t, ctx, bed.Client, bed.Namespace, thickSC, ns+"-luks",
		map[string]string{volume.ParamEncryption: volume.EncryptionLUKS2})
}

// TestEncryptedVolumeOnTheRealNode: an encrypted claim through the
// shipped DaemonSet, whose container runs cryptsetup:
//   - a pod writes a known pattern; the opened device holds it, the raw
//     LV (what a stolen disk shows) does not, and the LV is a LUKS2
//     device;
//   - carve's node agent killed while the volume is staged: the pod keeps
//     reading its file and writing;
//   - the key-encryption Secret rotated: at the next stage the volume's
//     token is wrapped under the new KEK; with the old KEK taken out of
//     the Secret by hand, the volume opens again and reads its file;
//   - the claim deleted: the freed extents' LUKS2 header has no keyslot
//     left (it had one before) and hold no plaintext.
func TestEncryptedVolumeOnTheRealNode(t *testing.T) {
	ns := newNamespace(t, "luks")
	ctx := testCtx(t, 15*time.Minute)
	sc := encryptedClass(t, ctx, ns)
	pattern := "carve-plaintext-" + ns
	createClaimAndPod(t, newPVC(ns, "data", sc, "128Mi"), appPod(ns))
	sum := podExec(t, ns, "app", fmt.Sprintf("yes %s | head -c %d > /data/p && sync && sha256sum < /data/p", pattern, 8<<20))
	pv := pvOf(t, ns, "data")
	handle := volumeHandle(t, pv)
	raw := "/dev/" + handle
	mapped := "/dev/mapper/" + volume.MapperName(handle[strings.Index(handle, "/")+1:])

	if out := strings.TrimSpace(guestExec(t, "cryptsetup isLuks --type luks2 "+raw+" && echo luks2 || true")); out != "luks2" {
		t.Fatalf("the LV %s is not a LUKS2 device (%q)", raw, out)
	}
	if n := patternCount(t, "cat "+mapped, pattern); n == 0 {
		t.Fatalf("the opened device %s does not hold the pattern the pod wrote: the check of the raw LV could not fail", mapped)
	}
	if n := patternCount(t, "cat "+raw, pattern); n != 0 {
		t.Errorf("the raw LV %s holds the plaintext pattern %d times", raw, n)
	}

	// The agent killed while the volume is staged.
	restarts := containerStatus(carvePod(t, ctx), "carve").RestartCount
	guestExec(t, "pkill -KILL -f '^/usr/local/bin/carve-node node'")
	waitFor(t, podTimeout, "the carve container restarted and running", func(ctx context.Context) (bool, string, error) {
		p := carvePod(t, ctx)
		c := containerStatus(p, "carve")
		return c.RestartCount > restarts && c.State.Running != nil, fmt.Sprintf("restarts %d, %s", c.RestartCount, podState(p)), nil
	})
	if got := podExec(t, ns, "app", "sha256sum < /data/p && echo after-restart > /data/q && sync && cat /data/q"); got != sum+"\nafter-restart" {
		t.Errorf("after the agent's restart the pod reads %q, want the file's sum %q and its new file", got, sum)
	}

	rotateKEK(t, ctx, ns, handle, sum)

	// Delete: the header on the freed extents keeps no keyslot.
	extents := lvExtents(t, handle)
	if n := keyslotsAt(t, extents[0]); n != 1 {
		t.Fatalf("the volume's LUKS2 header has %d keyslots before its delete, want 1: the check after it could not fail", n)
	}
	deletePodWaitUnmounted(t, ns, "app", handle)
	if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podTimeout, "the LV "+handle+" removed", func(ctx context.Context) (bool, string, error) {
		out := strings.TrimSpace(guestExec(t, "lvs --noheadings -o lv_name "+handle+" 2>/dev/null || true"))
		return out == "", "lvs: " + out, nil
	})
	if n := keyslotsAt(t, extents[0]); n != 0 {
		t.Errorf("the deleted volume's header on its freed extents still has %d keyslots", n)
	}
	for _, e := range extents {
		if n := patternCount(t, e.ddArgs(), pattern); n != 0 {
			t.Errorf("the freed extents %s hold the plaintext pattern %d times", e, n)
		}
	}
}

// rotateKEK asks for a new key-encryption key, stages the volume of
// handle (the claim "data" of pod "app" in ns) again until its token is
// wrapped under it, then drops the old KEK from the Secret and checks the
// volume still opens and reads sum.
func rotateKEK(t *testing.T, ctx context.Context, ns, handle, sum string) {
	t.Helper()
	secrets := bed.Client.CoreV1().Secrets(bed.Namespace)
	sec, err := secrets.Get(ctx, volumekey.DefaultSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldKEK := tokenKEK(t, handle)
	if _, ok := sec.Data["kek-"+oldKEK]; !ok {
		t.Fatalf("the volume's token is wrapped under KEK %s, which the Secret %s does not hold", oldKEK, volumekey.DefaultSecret)
	}
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	sec.Annotations[volumekey.RotateAnnotation] = "requested"
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller reads the Secret again at most a minute after its
	// last read, at a key's release: restage until the token moved on.
	var newKEK string
	waitFor(t, 5*time.Minute, "the volume's token wrapped under a new KEK", func(ctx context.Context) (bool, string, error) {
		restage(t, ns, handle, sum)
		newKEK = tokenKEK(t, handle)
		return newKEK != oldKEK, "token under KEK " + newKEK, nil
	})
	sec, err = secrets.Get(ctx, volumekey.DefaultSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sec.Data["kek-"+newKEK]; !ok {
		t.Fatalf("the token is wrapped under KEK %s, which the Secret does not hold", newKEK)
	}
	if _, ok := sec.Annotations[volumekey.RotateAnnotation]; ok {
		t.Errorf("the Secret keeps %s after the rotation", volumekey.RotateAnnotation)
	}
	delete(sec.Data, "kek-"+oldKEK)
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	restage(t, ns, handle, sum)
	t.Logf("the token moved from KEK %s to KEK %s; with KEK %s dropped the volume opened again", oldKEK, newKEK, oldKEK)
}

// appPod is pod "app" of claim "data", on the guest node (with the peer
// node in the bed, the scheduler could pick it, where no pod runs).
func appPod(ns string) *corev1.Pod {
	p := newPod(ns, "app", "data", false, sleeper)
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": nodeName}
	return p
}

// restage deletes pod "app" of ns (the volume of handle unstaged and
// closed) and makes it again, and checks it reads sum from /data/p.
func restage(t *testing.T, ns, handle, sum string) {
	t.Helper()
	deletePodWaitUnmounted(t, ns, "app", handle)
	mapped := volume.MapperName(handle[strings.Index(handle, "/")+1:])
	// Unstage unmounts, then closes the device.
	waitFor(t, shortWait, "the unstaged volume's device "+mapped+" closed", func(ctx context.Context) (bool, string, error) {
		out := strings.TrimSpace(guestExec(t, "dmsetup info -c --noheadings -o name "+mapped+" 2>/dev/null || true"))
		return out == "", "dmsetup: " + out, nil
	})
	createPod(t, appPod(ns))
	if got := podExec(t, ns, "app", "sha256sum < /data/p"); got != sum {
		t.Fatalf("the staged volume reads %q, want %q", got, sum)
	}
}

// tokenKEK is the ID of the KEK carve's token in the LUKS2 header of
// handle wraps its key under.
func tokenKEK(t *testing.T, handle string) string {
	t.Helper()
	var tok struct {
		Wrapped string `json:"carve_wrapped_key"`
	}
	out := guestExec(t, "cryptsetup token export --token-id 0 /dev/"+handle)
	if err := json.Unmarshal([]byte(out), &tok); err != nil {
		t.Fatalf("the token of %s: %v: %q", handle, err, out)
	}
	kek, err := volumekey.KEKOf(tok.Wrapped)
	if err != nil {
		t.Fatalf("the token of %s: %v", handle, err)
	}
	return kek
}

// patternCount counts the lines that hold pattern in what the guest
// command read prints (`cat <device>`, or extentRange.ddArgs).
func patternCount(t *testing.T, read, pattern string) int {
	t.Helper()
	out := strings.TrimSpace(guestExec(t, fmt.Sprintf("%s | grep -a -c -F %s || true", read, pattern)))
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("counting the pattern in %s: %q", read, out)
	}
	return n
}

// extentRange is where on a physical volume a segment of an LV lies, in
// 512-byte sectors.
type extentRange struct {
	device        string
	start, length int64
}

func (e extentRange) String() string {
	return fmt.Sprintf("%s sectors %d+%d", e.device, e.start, e.length)
}

// ddArgs reads the range past the page cache: what the guest read of
// the physical volume before would otherwise be read again, whatever the
// LV's own device wrote since.
func (e extentRange) ddArgs() string {
	return fmt.Sprintf("dd if=%s bs=1M iflag=direct,skip_bytes,count_bytes skip=%d count=%d status=none", e.device, e.start*512, e.length*512)
}

// lvExtents is where the LV handle lies on its physical volumes, in
// order: the first range holds its LUKS2 header.
func lvExtents(t *testing.T, handle string) []extentRange {
	t.Helper()
	vg := handle[:strings.Index(handle, "/")]
	out := guestExec(t, fmt.Sprintf(`set -e
ext=$(vgs --noheadings --units s --nosuffix -o vg_extent_size %[1]s)
lvs --noheadings --units s --nosuffix -o seg_pe_ranges %[2]s | tr ' ' '\n' | grep : | while IFS=: read -r dev range; do
  start=$(pvs --noheadings --units s --nosuffix -o pe_start "$dev")
  echo "$dev $(( $(echo $start) + ${range%%%%-*} * $(echo $ext) )) $(( (${range##*-} - ${range%%%%-*} + 1) * $(echo $ext) ))"
done`, vg, handle))
	var ranges []extentRange
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e extentRange
		if _, err := fmt.Sscan(line, &e.device, &e.start, &e.length); err != nil {
			t.Fatalf("the extents of %s: %v: %q", handle, err, out)
		}
		ranges = append(ranges, e)
	}
	if len(ranges) == 0 || ranges[0].length < 32768 {
		t.Fatalf("the extents of %s: %q", handle, out)
	}
	return ranges
}

// keyslotsAt counts the keyslots of the LUKS2 header at the start of e
// (its first 16 MiB read into a file in the guest, past the page cache).
func keyslotsAt(t *testing.T, e extentRange) int {
	t.Helper()
	out := strings.TrimSpace(guestExec(t, fmt.Sprintf(`set -e
f=$(mktemp)
%s of="$f"
cryptsetup luksDump "$f" | awk '/^Keyslots:/ {k=1; next} /^[A-Z]/ {k=0} k && /^ +[0-9]+: / {n++} END {print n+0}'
rm -f "$f"`, extentRange{device: e.device, start: e.start, length: 32768}.ddArgs())))
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("the keyslots at %s: %q", e, out)
	}
	return n
}

// TestCrossNodeEncryptedVolume (make test-nodes-peer): an encrypted
// volume across nodes carries its ciphertext only and opens on the node
// it lands on. A pod on the guest node writes random bytes to an encrypted
// claim; a VolumeSnapshot of it is restored on the peer: the claim binds
// there, its LV is the source LV byte for byte (the LUKS2 header and the
// ciphertext travel as they are) and its PV records the source's key ID.
// Then `kubectl carve move` brings the restored claim to the guest node,
// where a pod reads the file back: the key was released to the node the
// volume landed on.
func TestCrossNodeEncryptedVolume(t *testing.T) {
	needPeer(t)
	ns := newNamespace(t, "crossluks")
	ctx := testCtx(t, 20*time.Minute)
	dc, err := dynamic.NewForConfig(bed.Control.Config)
	if err != nil {
		t.Fatal(err)
	}
	sc := encryptedClass(t, ctx, ns)
	fileSum, sourceSum := crossNodeSource(t, ctx, dc, ns, sc, "96Mi", 16)
	sourcePV := pvOf(t, ns, "data")

	group := "snapshot.storage.k8s.io"
	pvc := newPVC(ns, "restored", sc, "96Mi")
	pvc.Annotations = map[string]string{placement.AnnSelectedNode: peerName}
	pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkRestoredOnPeer(t, ctx, ns, "restored", 5*time.Minute, sourceSum)
	restoredPV := pvOf(t, ns, "restored")
	if src, got := keyIDOf(t, ctx, sourcePV), keyIDOf(t, ctx, restoredPV); src == "" || got != src {
		t.Errorf("the restored PV %s records key ID %q, want the source's %q", restoredPV, got, src)
	}

	out, err := kubectlCarve(ctx, "move", ns+"/restored", "--to", nodeName, "--timeout", "10m").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl carve move: %v: %s", err, out)
	}
	moved := waitClaimBound(t, ns, "restored", shortWait)
	if got := pvNode(t, moved); got != nodeName {
		t.Fatalf("the moved claim's PV %s is on %s, want %s", moved, got, nodeName)
	}
	if _, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, restoredPV, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the peer's PV %s is still there after the move (%v)", restoredPV, err)
	}
	reader := newPod(ns, "reader", "restored", false, sleeper)
	reader.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": nodeName}
	createPod(t, reader)
	if got := strings.Fields(podExec(t, ns, "reader", "sha256sum /data/f"))[0]; got != fileSum {
		t.Errorf("the moved volume's file reads %q, want the source's %q", got, fileSum)
	}
}

// keyIDOf is the key ID the PV pv records for its encrypted volume.
func keyIDOf(t *testing.T, ctx context.Context, pv string) string {
	t.Helper()
	p, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
	if err != nil || p.Spec.CSI == nil {
		t.Fatalf("PV %s: %v", pv, err)
	}
	return p.Spec.CSI.VolumeAttributes[volume.ContextKeyID]
}
