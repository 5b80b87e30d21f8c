//go:build nodes && databases

package nodes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/test/harness/kubetest"
	"github.com/carve-csi/carve/test/harness/pgcheck"
)

// benchRunTime is one pgbench run's length in TestMeasureDatabaseTPS.
const benchRunTime = 40 * time.Second

// TestMeasureDatabaseTPS (make bench-database) is the figure a database
// operator asks first: pgbench's TPC-B-like transactions per second on a
// carve volume against the same workload on a raw LV in the same volume
// group of the same guest, in one run. Three PostgreSQL servers, made and
// configured alike (the tier's postgresPod), run side by side in the
// guest: on a carve thick claim, on a carve thin claim, and on an LV this
// test makes by hand in the thick class's volume group, formatted with
// the mkfs.ext4 options carve uses and mounted into the pod by hostPath.
// All three are ext4, so thin against thick differs by the thin pool
// alone, and carve thick against the raw LV by nothing in the IO path
// (both are device-mapper linear targets). Each round runs pgbench on
// one server at a time (the others idle), in an order that rotates from
// round to round, after a CHECKPOINT; CARVE_MEASURE_ROUNDS rounds
// (default 3) of benchRunTime each. It prints the median TPS of each and
// the ratios (goal: carve thick / raw >= 0.98). It fails only when a run
// fails: the guest is emulated and shares the machine, so a ratio below
// the goal is a figure to explain, not a broken build.
func TestMeasureDatabaseTPS(t *testing.T) {
	rounds := kubetest.Rounds(t, 3)
	began := time.Now()
	ns := newNamespace(t, "pgtps")
	ctx := testCtx(t, 20*time.Minute+time.Duration(rounds)*4*benchRunTime)
	thinExt4 := kubetest.ClassLike(t, ctx, bed.Client, bed.Namespace, thinSC, "carve-thin-ext4-"+ns,
		map[string]string{"csi.storage.k8s.io/fstype": "ext4"})

	for claim, sc := range map[string]string{"thick": thickSC, "thin": thinExt4} {
		if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, newPVC(ns, claim, sc, "1Gi"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rawDir := rawLV(t, ns)
	raw := postgresPod(ns, "pg-raw", "", 0)
	raw.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": nodeName}
	dirType := corev1.HostPathDirectory
	raw.Spec.Volumes[0].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: rawDir, Type: &dirType}}
	pods := []*corev1.Pod{postgresPod(ns, "pg-thick", "thick", 0), postgresPod(ns, "pg-thin", "thin", 0), raw}
	// The raw LV's pod goes before the LV: its mount keeps the LV open.
	t.Cleanup(func() { deletePodGone(t, ns, "pg-raw") })
	for _, p := range pods {
		if _, err := bed.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		waitPostgres(t, ns, p.Name)
		initBench(t, ns, p.Name)
	}
	t.Logf("three PostgreSQL servers made and pgbench's tables filled %s after the start", time.Since(began).Round(time.Second))

	tps := map[string][]float64{}
	names := []string{"pg-thick", "pg-raw", "pg-thin"}
	for r := range rounds {
		var line []string
		for i := range names {
			pod := names[(i+r)%len(names)]
			if _, err := pgExec(ctx, ns, pod, 5*time.Minute, psql+"-c checkpoint"); err != nil {
				t.Fatal(err)
			}
			out, err := pgExec(ctx, ns, pod, benchRunTime+5*time.Minute,
				fmt.Sprintf("pgbench -h /tmp -U postgres -n -c 2 -j 2 -T %d postgres 2>&1", int(benchRunTime.Seconds())))
			if err != nil {
				t.Fatal(err)
			}
			v, err := pgcheck.ParseTPS(out)
			if err != nil {
				t.Fatalf("%s: %v", pod, err)
			}
			tps[pod] = append(tps[pod], v)
			line = append(line, fmt.Sprintf("%s %.1f", pod, v))
		}
		t.Logf("round %d: %s", r+1, strings.Join(line, ", "))
	}
	thick, rawTPS, thin := median(tps["pg-thick"]), median(tps["pg-raw"]), median(tps["pg-thin"])
	t.Logf("MEASURE database tps: %d rounds of %s, pgbench -c 2 -j 2 scale 1, median TPS: carve thick %.1f, raw LV %.1f, carve thin %.1f; carve thick / raw %.3f (goal >= 0.98), thin / thick %.3f; %s in all",
		rounds, benchRunTime, thick, rawTPS, thin, thick/rawTPS, thin/thick, time.Since(began).Round(time.Second))
	for _, p := range names {
		checkDatabase(t, ns, p, nil)
	}
}

// rawLV makes an LV by hand in the thick class's volume group (the
// shipped classes' "carve") of the guest node, formats it as carve
// formats ext4 (internal/node/fs's default options) and mounts it on the
// guest; it returns the mount point, and unmounts and removes the LV when
// the test ends.
func rawLV(t *testing.T, ns string) string {
	t.Helper()
	lv := "bench-raw-" + ns
	dir := "/var/lib/carve-bench/" + ns
	guestExec(t, fmt.Sprintf(`set -e
export DM_DISABLE_UDEV=1
lvcreate -q -y -L 1g -n %[1]s carve
mkfs.ext4 -q -E nodiscard -O ^orphan_file /dev/carve/%[1]s
mkdir -p %[2]s
mount /dev/carve/%[1]s %[2]s`, lv, dir))
	t.Cleanup(func() {
		// The pod's container may still hold the filesystem for a while
		// after its pod is gone from the API (deletePodGone).
		out, err := bed.GuestNode(nodeName).Exec(testCtx(t, 3*time.Minute), fmt.Sprintf(`export DM_DISABLE_UDEV=1
for i in $(seq 90); do
	if mountpoint -q %[2]s; then umount %[2]s 2>/dev/null; fi
	if ! mountpoint -q %[2]s && lvremove -q -y carve/%[1]s 2>/dev/null; then break; fi
	sleep 1
done
if lvs carve/%[1]s >/dev/null 2>&1; then lvremove -q -y carve/%[1]s; exit 1; fi
rmdir %[2]s`, lv, dir))
		if err != nil {
			t.Errorf("remove the raw LV %s: %v: %s", lv, err, out)
		}
	})
	return dir
}

// deletePodGone deletes the pod and waits until the API no longer has it.
// With the tier's grace period of 0 the API drops it at once, while the
// kubelet may still be stopping its container.
func deletePodGone(t *testing.T, ns, pod string) {
	t.Helper()
	err := bed.Client.CoreV1().Pods(ns).Delete(testCtx(t, time.Minute), pod, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("delete pod %s/%s: %v", ns, pod, err)
		return
	}
	waitFor(t, podTimeout, "pod "+pod+" gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, "still there", err
	})
}

// median is the middle value of v (the mean of the two middle ones for
// an even count).
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
