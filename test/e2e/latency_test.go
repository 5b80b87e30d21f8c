//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/carve-csi/carve/test/harness/kubetest"
)

// TestProvisioningLatency measures, over 20 volumes made one after the
// other, the time from creating a PVC and its pod to the PVC being Bound,
// split into scheduling (until the scheduler writes the selected-node
// annotation) and provisioning plus binding (until Bound); carve's own
// share comes from its carve_phase_duration_seconds histogram. It reports
// figures, it does not assert timings; it does assert that every volume was
// asked for and no CreateVolume failed.
func TestProvisioningLatency(t *testing.T) {
	const volumes = 20
	ns := newNamespace(t, "latency")
	ctx := testCtx(t, 5*time.Minute)
	callsBefore, err := createVolumeCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	okBefore, err := metricSum(ctx, "carve_phase_duration_seconds_count", `phase="create"`, `result="OK"`)
	if err != nil {
		t.Fatal(err)
	}
	carveBefore, err := metricSum(ctx, "carve_phase_duration_seconds_sum", `phase="create"`)
	if err != nil {
		t.Fatal(err)
	}
	w, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	var total, sched, prov []time.Duration
	for i := range volumes {
		name := fmt.Sprintf("v%02d", i)
		start := createPVCAndPod(t, ctx, newPVC(ns, name, thickSC, "256Mi"), newPod(ns, name, name))
		var selected time.Time
		timeout := time.After(settle)
	wait:
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatal("PVC watch closed")
				}
				pvc, isPVC := ev.Object.(*corev1.PersistentVolumeClaim)
				if !isPVC || ev.Type == watch.Deleted || pvc.Name != name {
					continue
				}
				now := time.Now()
				if selected.IsZero() && pvc.Annotations[annSelected] != "" {
					selected = now
				}
				if pvc.Status.Phase == corev1.ClaimBound {
					if selected.IsZero() {
						selected = now
					}
					total = append(total, now.Sub(start))
					sched = append(sched, selected.Sub(start))
					prov = append(prov, now.Sub(selected))
					break wait
				}
			case <-timeout:
				t.Fatalf("PVC %s not Bound within %s", name, settle)
			}
		}
	}
	callsAfter, err := createVolumeCalls(ctx)
	if err != nil {
		t.Fatal(err)
	}
	carveAfter, err := metricSum(ctx, "carve_phase_duration_seconds_sum", `phase="create"`)
	if err != nil {
		t.Fatal(err)
	}
	okAfter, err := metricSum(ctx, "carve_phase_duration_seconds_count", `phase="create"`, `result="OK"`)
	if err != nil {
		t.Fatal(err)
	}
	// csi-provisioner may ask again, idempotently, for a claim it requeued
	// before its informer saw the PV it had just saved: an extra call that
	// answers OK is its timing, not carve's. A call that failed, or a
	// volume never asked for, is carve's.
	calls, failed := callsAfter-callsBefore, (callsAfter-callsBefore)-(okAfter-okBefore)
	if failed != 0 || calls < volumes {
		t.Errorf("carve saw %v CreateVolume calls for %d volumes, %v of them failed; want at least one each and none failed", calls, volumes, failed)
	}
	if calls > volumes {
		t.Logf("%v CreateVolume calls for %d volumes: csi-provisioner repeated %v, answered OK (idempotent)", calls, volumes, calls-volumes)
	}
	carveMean := time.Duration((carveAfter - carveBefore) / volumes * float64(time.Second))
	report := fmt.Sprintf("PVC+pod created -> PVC Bound over %d volumes: median %s, p90 %s; scheduling (until selected-node) median %s, p90 %s; provisioning+binding median %s, p90 %s; carve CreateVolume mean %s",
		volumes, pct(total, 50), pct(total, 90), pct(sched, 50), pct(sched, 90), pct(prov, 50), pct(prov, 90), carveMean.Round(time.Microsecond))
	t.Log(report)
	fmt.Println("e2e figures:", report)
}

// pct is the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration { return kubetest.Percentile(ds, p) }
