//go:build nodes

package nodes

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/controller/mover"
	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// drainSize is the size of each claim of the drain: small, the copies
// run under TCG.
const drainSize = "64Mi"

// TestCrossNodeDrain (make test-nodes-peer): `kubectl carve drain real-1
// --to peer-1` (bin/kubectl-carve through the bed's kubeconfig), the
// guest node cordoned first as docs/operations.md asks, moves the node's
// two carve claims one at a time: "app", thick ext4, mounted by a running
// pod that wrote /data/f and /data/log, and "idle", a thin raw block
// claim (no filesystem: 64 MiB, not xfs's 300) that a pod wrote 16 MiB
// of random bytes to and finished. "stay", a claim on the peer already, is
// left alone. The command exits 0 and names each claim and its end; each
// move is asked (carve.dev/move-to on the claim) only once the one before
// ended (its old PV deleted), in the API server's order of writes; each
// claim ends Bound under its name to the mover's PV on the peer, whose LV
// is in the peer's volume group and holds, byte for byte, what the
// source's did once closed; the old PVs, LVs and seeds are gone, and no
// PV but the mover's two was made.
func TestCrossNodeDrain(t *testing.T) {
	peer := needPeer(t)
	ctx := testCtx(t, 15*time.Minute)
	ns := newNamespace(t, "drain")
	pvs := watchPVs(t, ctx, ns)
	moves := watchMoves(t, ctx, ns)
	onGuest := map[string]string{"kubernetes.io/hostname": nodeName}

	// The claim, not the pod, is pinned to the guest: a pod whose
	// nodeSelector names the guest could not run on the peer, and the
	// mover refuses a target the claim's pods cannot run on.
	appClaim := newPVC(ns, "app", thickSC, drainSize)
	appClaim.Annotations = map[string]string{placement.AnnSelectedNode: nodeName}
	createClaimAndPod(t, appClaim, newPod(ns, "app", "app", false, sleeper))
	fileSum := strings.Fields(podExec(t, ns, "app", "head -c 16777216 /dev/urandom > /data/f && head -c 65536 /dev/urandom > /data/log && sync && sha256sum /data/f"))[0]

	once := newPod(ns, "once", "idle", true, "dd if=/dev/urandom of=/dev/xvda bs=1M count=16 iflag=fullblock oflag=direct status=none")
	once.Spec.NodeSelector = onGuest
	once.Spec.RestartPolicy = corev1.RestartPolicyNever
	idle := newPVC(ns, "idle", thinSC, drainSize)
	block := corev1.PersistentVolumeBlock
	idle.Spec.VolumeMode = &block
	kubetest.CreateClaimAndPod(t, ctx, bed.Client, idle, once)
	waitFor(t, podTimeout, "pod once Succeeded", func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "once", metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodFailed {
			err = fmt.Errorf("it failed: %s", podState(p))
		}
		if err != nil {
			return false, "", err
		}
		return p.Status.Phase == corev1.PodSucceeded, podState(p), nil
	})

	stay := newPVC(ns, "stay", thickSC, drainSize)
	stay.Annotations = map[string]string{placement.AnnSelectedNode: peerName}
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, stay, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stayPV := waitClaimBound(t, ns, "stay", shortWait)

	type source struct {
		claim, pv, handle string
		sum               <-chan closedSum
	}
	var sources []source
	made := []string{}
	for _, c := range []string{"app", "idle"} {
		pv := pvOf(t, ns, c)
		h := volumeHandle(t, pv)
		sources = append(sources, source{c, pv, h, sumWhenClosed(ctx, h)})
		made = append(made, pv)
	}
	made = append(made, stayPV)

	out, _ := cordonAndDrain(t, ctx, nodeName, peerName, "5m")
	// Each claim's last line is the Event Moved, or, when the Event is
	// not listed yet as the move ends, the PV it is bound to.
	want := [][]string{{fmt.Sprintf("node %s: 2 claim(s) to move", nodeName)}}
	for _, s := range sources {
		claim := fmt.Sprintf("claim %s/%s: ", ns, s.claim)
		want = append(want, []string{fmt.Sprintf("%smove to %s asked (volume %s)", claim, peerName, s.pv)},
			[]string{fmt.Sprintf("%sMoved: Moved from node %s to node %s", claim, nodeName, peerName), claim + "moved: bound to " + mover.TargetName(s.pv, peerName)})
	}
	want = append(want, []string{fmt.Sprintf("node %s: every carve claim moved off it", nodeName)})
	for _, w := range want {
		if !slices.ContainsFunc(w, func(line string) bool { return strings.Contains(string(out), line) }) {
			t.Errorf("kubectl carve drain said nothing like %q", w[0])
		}
	}
	moves.check(t, "app", "idle")

	for _, s := range sources {
		target := checkMoved(t, ctx, ns, s.claim, s.pv, s.handle, peerName, peer.VG, moves.seed(s.pv))
		made = append(made, target)
		sum := <-s.sum
		if sum.err != nil {
			t.Fatalf("the source LV %s of %s once closed: %v", s.handle, s.claim, sum.err)
		}
		handle := volumeHandle(t, target)
		got, err := bed.GuestNode(nodeName).SHA256OfLV(ctx, handle)
		if err != nil {
			t.Fatal(err)
		}
		if got != sum.sum {
			t.Errorf("claim %s: the LV %s on %s has SHA-256 %s, want the source's %s once closed", s.claim, handle, peerName, got, sum.sum)
		}
		if s.claim == "app" {
			if files := filesOnLV(t, ctx, handle); !strings.Contains(files, fileSum+"  f") {
				t.Errorf("claim app: /data/f on the peer's LV: %q, want SHA-256 %s", files, fileSum)
			}
		}
	}
	if got := waitClaimBound(t, ns, "stay", shortWait); got != stayPV {
		t.Errorf("claim stay, on %s already, is bound to %s, want %s still", peerName, got, stayPV)
	}
	if got := pvs.names(); !slices.Equal(got, made) {
		t.Errorf("PVs made for namespace %s: %v, want the claims' first and the mover's: %v", ns, got, made)
	}
}

// moveWindows follows the moves of one namespace's claims in the API
// server's order of writes (resource versions, etcd's revisions: one
// order for claims and PVs, whichever watch delivers an event first):
// when each claim's move was asked (the first write that shows
// carve.dev/move-to on it) and when it ended (its old PV, in a move,
// deleted), and each old PV's seed.
type moveWindows struct {
	mu           sync.Mutex
	asked, ended map[string]uint64 // by claim
	seeds        map[string]string // by old PV
	errs         []string
}

// watchMoves watches ns's claims and every PV until ctx ends.
func watchMoves(t *testing.T, ctx context.Context, ns string) *moveWindows {
	t.Helper()
	w := &moveWindows{asked: map[string]uint64{}, ended: map[string]uint64{}, seeds: map[string]string{}}
	claims, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvs, err := bed.Client.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		claims.Stop()
		t.Fatal(err)
	}
	go func() {
		defer claims.Stop()
		for ev := range claims.ResultChan() {
			if c, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && c.Annotations[moveapi.AnnMoveTo] != "" {
				w.note(w.asked, c.Name, c.ResourceVersion)
			}
		}
	}()
	go func() {
		defer pvs.Stop()
		for ev := range pvs.ResultChan() {
			pv, ok := ev.Object.(*corev1.PersistentVolume)
			if !ok || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != ns || pv.Annotations[moveapi.AnnPhase] == "" {
				continue
			}
			if s := pv.Annotations[moveapi.AnnSeed]; s != "" {
				w.mu.Lock()
				w.seeds[pv.Name] = s
				w.mu.Unlock()
			}
			if ev.Type == watch.Deleted {
				w.note(w.ended, pv.Spec.ClaimRef.Name, pv.ResourceVersion)
			}
		}
	}()
	return w
}

// note keeps the first revision seen for claim in m.
func (w *moveWindows) note(m map[string]uint64, claim, rv string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		w.errs = append(w.errs, fmt.Sprintf("claim %s: resource version %q: %v", claim, rv, err))
		return
	}
	if _, ok := m[claim]; !ok {
		m[claim] = n
	}
}

func (w *moveWindows) seed(pv string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seeds[pv]
}

// check fails the test unless each claim's move was asked and ended, in
// the order given, each asked only after the one before ended.
func (w *moveWindows) check(t *testing.T, claims ...string) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		t.Error(e)
	}
	for i, c := range claims {
		asked, ended := w.asked[c], w.ended[c]
		if asked == 0 || ended == 0 || ended < asked {
			t.Errorf("claim %s: move asked at revision %d, ended (old PV deleted) at %d: want both, in that order", c, asked, ended)
			continue
		}
		if i > 0 && asked < w.ended[claims[i-1]] {
			t.Errorf("the move of claim %s was asked (revision %d) before the move of %s ended (revision %d): two moves in flight",
				c, asked, claims[i-1], w.ended[claims[i-1]])
		}
	}
}

// cordonAndDrain cordons from (uncordoned when the test ends) and runs
// `kubectl carve drain from --to to --timeout timeout`, which must
// succeed; it returns what the command said and how long it took.
func cordonAndDrain(t *testing.T, ctx context.Context, from, to, timeout string) ([]byte, time.Duration) {
	t.Helper()
	cordon(t, ctx, from, true)
	t.Cleanup(func() { cordon(t, context.Background(), from, false) })
	start := time.Now()
	out, err := kubectlCarve(ctx, "drain", from, "--to", to, "--timeout", timeout).CombinedOutput()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("kubectl carve drain %s --to %s: %v\n%s", from, to, err, out)
	}
	t.Logf("kubectl carve drain %s --to %s took %s:\n%s", from, to, took.Round(time.Second), out)
	return out, took
}
