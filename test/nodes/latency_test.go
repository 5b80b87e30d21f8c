//go:build nodes

package nodes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/test/harness/kubetest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// carveMetrics scrapes the carve node of the guest node (from inside the
// guest: the pod's address is on the guest's bridge).
func carveMetrics(t *testing.T, ctx context.Context) plugintest.Metrics {
	t.Helper()
	p := carvePod(t, ctx)
	out := guestExec(t, fmt.Sprintf("curl -sS --max-time 20 http://%s:9810/metrics", p.Status.PodIP))
	ms, err := plugintest.ParseMetrics(strings.NewReader(out))
	if err != nil {
		t.Fatalf("carve's metrics: %v", err)
	}
	return ms
}

// nodeCallMean returns the count and the summed seconds of one Node RPC
// from csi-lib-utils' csi_plugin_operations_seconds.
func nodeCallStats(ms plugintest.Metrics, method string) (uint64, float64) {
	want := map[string]string{"method_name": "/csi.v1.Node/" + method}
	return ms.HistogramCount("csi_plugin_operations_seconds", want), ms.HistogramSum("csi_plugin_operations_seconds", want)
}

// TestPodsStartOnTheRealNode runs ten claims with their pods, one after the
// other, and checks that each pod runs with its volume mounted at the
// claim's size. It prints how long PVC + pod took to a running container,
// split into scheduling (until the scheduler picks the node for the
// claim), provisioning (until the claim is Bound), binding the pod, and the
// node side: NodeStage (mkfs and mount), NodePublish and the rest (the
// kubelet's volume manager, the sandbox and the container start).
func TestPodsStartOnTheRealNode(t *testing.T) {
	ns := newNamespace(t, "latency")
	ctx := testCtx(t, 20*time.Minute)
	const pods = 10
	before := carveMetrics(t, ctx)
	var total, sched, prov, bind, node []time.Duration
	for i := range pods {
		name := fmt.Sprintf("p%d", i)
		start := time.Now()
		pvc := newPVC(ns, name, thickSC, "128Mi")
		pod := newPod(ns, name, name, false, sleeper)
		if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := bed.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var selected, bound, placed, running time.Duration
		// Poll often: provisioning takes a tenth of a second.
		kubetest.Poll(t, 50*time.Millisecond, podTimeout, "pod "+name+" running", func(ctx context.Context) (bool, string, error) {
			if bound == 0 {
				c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, "", err
				}
				if selected == 0 && c.Annotations["volume.kubernetes.io/selected-node"] != "" {
					selected = time.Since(start)
				}
				if c.Status.Phase == corev1.ClaimBound {
					bound = time.Since(start)
				}
			}
			p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			if placed == 0 && p.Spec.NodeName != "" {
				placed = time.Since(start)
			}
			if allRunning(p) && placed != 0 {
				running = time.Since(start)
				return true, "", nil
			}
			return false, podState(p), nil
		}, nil)
		size, _ := dfBytes(t, ns, name, "/data")
		if size <= 100<<20 || size > 128<<20 {
			t.Errorf("pod %s: /data is %d bytes, want a filesystem on the 128 MiB volume", name, size)
		}
		total = append(total, running)
		sched = append(sched, selected)
		prov = append(prov, bound-selected)
		bind = append(bind, placed-bound)
		node = append(node, running-placed)
	}
	after := carveMetrics(t, ctx)
	report := func(what string, d []time.Duration) {
		slices.Sort(d)
		t.Logf("%-44s median %6.2f s  p90 %6.2f s", what, d[len(d)/2].Seconds(), d[len(d)*9/10].Seconds())
	}
	t.Logf("PVC + pod -> container running on %s (TCG guest), %d pods one after the other:", nodeName, pods)
	report("total", total)
	report("scheduling (node selected for the claim)", sched)
	report("provisioning (then PVC Bound)", prov)
	report("binding (then pod bound to the node)", bind)
	report("node side (then container running)", node)
	for _, m := range []string{"NodeStageVolume", "NodePublishVolume"} {
		c0, s0 := nodeCallStats(before, m)
		c1, s1 := nodeCallStats(after, m)
		if c1-c0 < pods {
			t.Errorf("carve counted %d %s calls for %d pods", c1-c0, m, pods)
			continue
		}
		t.Logf("  of which carve's %-18s mean %6.2f s over %d calls", m, (s1-s0)/float64(c1-c0), c1-c0)
	}
}
