//go:build nodes

package nodes

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-csi/carve/internal/volume"
)

// rateTolerance is how far a measured rate may be from its limit.
const rateTolerance = 0.10

// writeRate runs a direct-IO dd of mib MiB in the pod, to path (a file on
// the volume, or its block device), and returns the bytes per second it
// measured from the clock around it (dd's own figure is rounded).
func writeRate(t *testing.T, ns, pod, path string, mib int) float64 {
	t.Helper()
	out := podExec(t, ns, pod, fmt.Sprintf(`s=$(date +%%s.%%N)
dd if=/dev/zero of=%s bs=1M count=%d oflag=direct conv=notrunc status=none
e=$(date +%%s.%%N)
echo "$s $e"`, path, mib))
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("dd in %s/%s: %q", ns, pod, out)
	}
	start, err1 := strconv.ParseFloat(f[0], 64)
	end, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || end <= start {
		t.Fatalf("dd in %s/%s: times %q", ns, pod, out)
	}
	return float64(mib<<20) / (end - start)
}

func mibps(r float64) string { return fmt.Sprintf("%.2f MiB/s", r/(1<<20)) }

// wantNear fails the test when rate is not within rateTolerance of limit.
func wantNear(t *testing.T, what string, rate, limit float64) {
	t.Helper()
	if math.Abs(rate-limit)/limit > rateTolerance {
		t.Errorf("%s: %s, want %s ± %.0f %%", what, mibps(rate), mibps(limit), rateTolerance*100)
	}
}

// limitedRate measures a writer under limit up to three times and
// returns the highest rate: every one must stay below the limit and its
// tolerance, and the highest must come within the tolerance. Under TCG,
// with other tiers sharing the 2 cores, a throttled writer whose vCPU or
// the kernel's throttle timer is starved falls short of its limit (seen:
// 6.95 MiB/s at 8, the next sample 7.81); it can never pass it.
func limitedRate(t *testing.T, what, ns, pod, path string, mib int, limit float64) float64 {
	t.Helper()
	best := 0.0
	for i := 0; i < 3; i++ {
		rate := writeRate(t, ns, pod, path, mib)
		t.Logf("MEASURE iolimits %s sample=%d rate=%s", what, i+1, mibps(rate))
		if rate > limit*(1+rateTolerance) {
			t.Errorf("%s: %s, above the limit %s", what, mibps(rate), mibps(limit))
		}
		best = max(best, rate)
		if math.Abs(best-limit)/limit <= rateTolerance {
			break
		}
	}
	wantNear(t, what, best, limit)
	return best
}

// newVAC makes a VolumeAttributesClass of carve with params, deleted at
// the end of the test.
func newVAC(t *testing.T, name string, params map[string]string) {
	t.Helper()
	ctx := testCtx(t, time.Minute)
	vac := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: name}, DriverName: "lvm.carve.dev", Parameters: params}
	if _, err := bed.Client.StorageV1().VolumeAttributesClasses().Create(ctx, vac, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Client.StorageV1().VolumeAttributesClasses().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}

// TestIOLimitsChangeLive: IO limits of a VolumeAttributesClass and of a
// StorageClass hold inside running pods, and a new class on a running
// claim reaches its pod within seconds, without a restart:
//   - pod "limited" (thick ext4 claim created with the class of 4 MiB/s
//     of writes) writes with direct IO at 4 MiB/s ± 10 %;
//   - pod "block" (raw block claim of a StorageClass whose parameters set
//     3 MiB/s of writes) writes at 3 MiB/s ± 10 %;
//   - pod "free" (a claim without limits on the same node) writes far
//     faster, alone and while "limited" writes as fast as it may, at no
//     less than half its rate alone;
//   - the claim of "limited" patched to the class of 8 MiB/s: its status
//     names the new class within 30 s, and the same pod (same UID, no
//     restart) then writes at 8 MiB/s ± 10 %;
//   - a class with a parameter carve does not know, set on the claim, is
//     refused: the claim reports the modify as Infeasible, keeps its
//     class, and the pod keeps 8 MiB/s;
//   - the pod's cgroup io.max holds the LV's line; with that line taken
//     out on the node (as a limit changed while the agent is down leaves
//     it) and carve's node agent killed, the restarted agent writes it
//     again, and the pod writes at 8 MiB/s ± 10 % again.
func TestIOLimitsChangeLive(t *testing.T) {
	ns := newNamespace(t, "iolimits")
	ctx := testCtx(t, 15*time.Minute)
	slow, faster, bogus := ns+"-4mib", ns+"-8mib", ns+"-bogus"
	newVAC(t, slow, map[string]string{volume.ParamWriteBytesPerSecond: "4Mi"})
	newVAC(t, faster, map[string]string{volume.ParamWriteBytesPerSecond: "8Mi"})
	newVAC(t, bogus, map[string]string{"carve.dev/write-speed": "fast"})

	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	del := corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: ns + "-3mib"},
		Provisioner: "lvm.carve.dev",
		Parameters: map[string]string{"carve.dev/device-class": "thin",
			volume.ParamWriteBytesPerSecond: strconv.Itoa(3 << 20)},
		VolumeBindingMode: &wffc, ReclaimPolicy: &del,
	}
	if _, err := bed.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Client.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	limitedPVC := newPVC(ns, "limited", thickSC, "512Mi")
	limitedPVC.Spec.VolumeAttributesClassName = &slow
	limited := createClaimAndPod(t, limitedPVC, newPod(ns, "limited", "limited", false, sleeper))
	blockPVC := newPVC(ns, "block", sc.Name, "256Mi")
	blockMode := corev1.PersistentVolumeBlock
	blockPVC.Spec.VolumeMode = &blockMode
	createClaimAndPod(t, blockPVC, newPod(ns, "block", "block", true, sleeper))
	createClaimAndPod(t, newPVC(ns, "free", thickSC, "512Mi"), newPod(ns, "free", "free", false, sleeper))

	const limitedMiB = 32 // 8 s at 4 MiB/s
	limitedRate(t, "class=4Mi", ns, "limited", "/data/f", limitedMiB, 4<<20)
	limitedRate(t, "storageclass=3Mi block", ns, "block", "/dev/xvda", 24, 3<<20)

	const freeMiB = 128
	alone := writeRate(t, ns, "free", "/data/f", freeMiB)
	// The limited pod writes beside it, as fast as it may, for longer.
	bg := make(chan float64, 1)
	go func() {
		out, err := kubectl(ctx, "exec", "-n", ns, "limited", "--", "dd", "if=/dev/zero", "of=/data/g", "bs=1M", "count=64", "oflag=direct", "status=none")
		if err != nil {
			t.Errorf("the limited pod's writer: %v %s", err, out)
		}
		bg <- 0
	}()
	time.Sleep(2 * time.Second)
	beside := writeRate(t, ns, "free", "/data/f", freeMiB)
	<-bg
	t.Logf("MEASURE iolimits unlimited alone=%s beside-limited=%s", mibps(alone), mibps(beside))
	if alone < 3*(4<<20) || beside < alone/2 {
		t.Errorf("the unlimited pod wrote %s alone and %s beside the limited one: want more than 3x the limit alone and at least half of that beside", mibps(alone), mibps(beside))
	}

	// A new class on the running claim.
	patch := func(class string) time.Time {
		t.Helper()
		body := fmt.Sprintf(`{"spec":{"volumeAttributesClassName":%q}}`, class)
		if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "limited", types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	claimStatus := func(ctx context.Context) (*corev1.PersistentVolumeClaim, string, error) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "limited", metav1.GetOptions{})
		if err != nil {
			return nil, "", err
		}
		cur := "<none>"
		if c.Status.CurrentVolumeAttributesClassName != nil {
			cur = *c.Status.CurrentVolumeAttributesClassName
		}
		mod := "<none>"
		if m := c.Status.ModifyVolumeStatus; m != nil {
			mod = fmt.Sprintf("%s to %s", m.Status, m.TargetVolumeAttributesClassName)
		}
		return c, fmt.Sprintf("current class %s, modify %s", cur, mod), nil
	}
	sent := patch(faster)
	waitFor(t, 30*time.Second, "the claim's current class "+faster, func(ctx context.Context) (bool, string, error) {
		c, st, err := claimStatus(ctx)
		if err != nil {
			return false, "", err
		}
		return c.Status.CurrentVolumeAttributesClassName != nil && *c.Status.CurrentVolumeAttributesClassName == faster, st, nil
	})
	took := time.Since(sent)
	t.Logf("MEASURE iolimits class=8Mi after-change=%s", took.Round(100*time.Millisecond))
	limitedRate(t, "class=8Mi", ns, "limited", "/data/f", 2*limitedMiB, 8<<20)
	if p := waitPodRunning(t, ns, "limited", ""); p.UID != limited.UID || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the pod was replaced or restarted (uid %s -> %s, restarts %d)", limited.UID, p.UID, p.Status.ContainerStatuses[0].RestartCount)
	}

	// A class carve refuses.
	patch(bogus)
	waitFor(t, time.Minute, "the modify to "+bogus+" reported Infeasible, with an Event naming the parameter", func(ctx context.Context) (bool, string, error) {
		c, st, err := claimStatus(ctx)
		if err != nil {
			return false, "", err
		}
		events, err := kubectl(ctx, "get", "events", "-n", ns, "--field-selector", "involvedObject.name=limited,involvedObject.kind=PersistentVolumeClaim,type=Warning",
			"-o", "custom-columns=MESSAGE:.message", "--no-headers")
		if err != nil {
			return false, "", err
		}
		m := c.Status.ModifyVolumeStatus
		named := strings.Contains(events, "carve.dev/write-speed")
		return m != nil && m.Status == corev1.PersistentVolumeClaimModifyVolumeInfeasible && m.TargetVolumeAttributesClassName == bogus &&
				c.Status.CurrentVolumeAttributesClassName != nil && *c.Status.CurrentVolumeAttributesClassName == faster && named,
			fmt.Sprintf("%s; a Warning names the parameter: %v", st, named), nil
	})
	limitedRate(t, "refused-class", ns, "limited", "/data/f", 2*limitedMiB, 8<<20)

	restartedAgentReapplies(t, ctx, ns, limited)
}

// restartedAgentReapplies: see TestIOLimitsChangeLive, last item.
func restartedAgentReapplies(t *testing.T, ctx context.Context, ns string, pod *corev1.Pod) {
	dir := strings.TrimSpace(guestExec(t, fmt.Sprintf("find /sys/fs/cgroup -maxdepth 4 -type d -name 'pod%s' | head -1", pod.UID)))
	if dir == "" {
		t.Fatalf("no cgroup of pod %s on the node", pod.UID)
	}
	ioMax := dir + "/io.max"
	line := strings.TrimSpace(guestExec(t, "cat "+ioMax))
	t.Logf("%s: %q", ioMax, line)
	f := strings.Fields(line)
	if len(f) != 5 || f[2] != "wbps=8388608" {
		t.Fatalf("%s holds %q, want one line of the LV with wbps=8388608", ioMax, line)
	}
	guestExec(t, fmt.Sprintf("echo '%s wbps=max' > %s", f[0], ioMax))
	if got := strings.TrimSpace(guestExec(t, "cat "+ioMax)); got != "" {
		t.Fatalf("%s still holds %q", ioMax, got)
	}
	restarts := containerStatus(carvePod(t, ctx), "carve").RestartCount
	guestExec(t, "pkill -KILL -f '^/usr/local/bin/carve-node node'")
	waitFor(t, podTimeout, "the carve container restarted and its io.max line back", func(ctx context.Context) (bool, string, error) {
		p := carvePod(t, ctx)
		c := containerStatus(p, "carve")
		got := strings.TrimSpace(guestExec(t, "cat "+ioMax))
		return c.RestartCount > restarts && got == line, fmt.Sprintf("restarts %d, io.max %q", c.RestartCount, got), nil
	})
	limitedRate(t, "after-agent-restart", ns, pod.Name, "/data/f", 64, 8<<20)
}
