//go:build peers

package peers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// claimSize is small, so that a burst of claims fits on the smallest node
// even when the scheduler's view of capacity lags behind.
const claimSize = "32Mi"

// driver is one side of the comparison.
type driver struct {
	name         string
	csiName      string
	storageClass string
}

var (
	carveSide   = driver{name: "carve", csiName: cluster.DriverName, storageClass: "carve-thick-ext4"}
	topolvmSide = driver{name: "TopoLVM", csiName: topolvmDriver, storageClass: topolvmSC}
)

// TestPeersLatency measures PVC + pod created → PVC Bound for both
// drivers in three patterns of opts.claims claims each: paced (one at a
// time, opts.gap after each Bound, the drivers alternating claim by claim),
// back to back (the next claim right after the last one is Bound, each
// driver in its own block) and burst (all claims created at once). It
// prints median and p90 for each driver and their ratio, and the medians
// of the two parts of each claim's time: until the scheduler chose the
// node (the PVC's selected-node annotation, set in the scheduler's
// PreBind) and from there to Bound (provisioning, the PV saved, the PV
// controller's binding); it asserts only that every claim was Bound by
// the driver it asked for.
func TestPeersLatency(t *testing.T) {
	sides := []driver{carveSide, topolvmSide}
	results := map[string]map[string][]time.Duration{} // pattern → driver → samples
	// The two parts of each sample: create → selected node, selected
	// node → Bound.
	scheduled := map[string]map[string][]time.Duration{}
	provisioned := map[string]map[string][]time.Duration{}
	record := func(pattern string, d driver, ts []timing) {
		for _, m := range []map[string]map[string][]time.Duration{results, scheduled, provisioned} {
			if m[pattern] == nil {
				m[pattern] = map[string][]time.Duration{}
			}
		}
		for _, x := range ts {
			results[pattern][d.name] = append(results[pattern][d.name], x.bound.Sub(x.start))
			scheduled[pattern][d.name] = append(scheduled[pattern][d.name], x.selected.Sub(x.start))
			provisioned[pattern][d.name] = append(provisioned[pattern][d.name], x.bound.Sub(x.selected))
		}
	}

	t.Run("paced", func(t *testing.T) {
		w := newWorkload(t, "paced")
		for i := range opts.claims {
			order := sides
			if i%2 == 1 {
				order = []driver{topolvmSide, carveSide}
			}
			for _, d := range order {
				record("paced", d, w.oneByOne(t, d, fmt.Sprintf("%s-%03d", short(d), i), 1, opts.gap))
			}
		}
		w.check(t)
	})
	t.Run("back-to-back", func(t *testing.T) {
		for _, d := range sides {
			w := newWorkload(t, "b2b-"+short(d))
			record("back-to-back", d, w.oneByOne(t, d, short(d), opts.claims, 0))
			w.check(t)
		}
	})
	t.Run("burst", func(t *testing.T) {
		for _, d := range []driver{topolvmSide, carveSide} {
			w := newWorkload(t, "burst-"+short(d))
			record("burst", d, w.burst(t, d, opts.claims))
			w.check(t)
		}
	})

	var report []string
	for _, pattern := range []string{"paced", "back-to-back", "burst"} {
		c, p := results[pattern][carveSide.name], results[pattern][topolvmSide.name]
		if len(c) == 0 || len(p) == 0 {
			continue
		}
		cm, c90 := kubetest.Percentile(c, 50), kubetest.Percentile(c, 90)
		pm, p90 := kubetest.Percentile(p, 50), kubetest.Percentile(p, 90)
		report = append(report,
			fmt.Sprintf("ratio PVC+pod -> Bound %s, %d claims each: median carve %s / TopoLVM %s = %.3f; p90 carve %s / TopoLVM %s = %.3f",
				pattern, len(c), cm, pm, ratio(cm, pm), c90, p90, ratio(c90, p90)))
	}
	for _, pattern := range []string{"paced", "back-to-back", "burst"} {
		var parts []string
		for _, d := range sides {
			if s, p := scheduled[pattern][d.name], provisioned[pattern][d.name]; len(s) > 0 {
				parts = append(parts, fmt.Sprintf("%s %s + %s", d.name, kubetest.Percentile(s, 50), kubetest.Percentile(p, 50)))
			}
		}
		if len(parts) > 0 {
			report = append(report, fmt.Sprintf("peers: PVC+pod -> Bound %s, medians of create -> selected node + selected node -> Bound: %s", pattern, strings.Join(parts, "; ")))
		}
	}
	for _, pattern := range []string{"back-to-back", "burst"} {
		for _, d := range sides {
			ds, base := results[pattern][d.name], kubetest.Percentile(results["paced"][d.name], 50)
			if len(ds) == 0 || base == 0 {
				continue
			}
			m := kubetest.Percentile(ds, 50)
			report = append(report, fmt.Sprintf("ratio %s median %s / paced median: %s / %s = %.3f", d.name, pattern, m, base, ratio(m, base)))
		}
	}
	for _, l := range report {
		t.Log(l)
		fmt.Println(l)
	}
}

// ratio is a / b.
func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// short is a name-friendly tag of the driver.
func short(d driver) string { return strings.ToLower(d.name) }

// workload is one namespace of claims and the watch that times them.
type workload struct {
	ns string
	// made lists every claim and the driver it asked for.
	made map[string]driver

	mu      sync.Mutex
	waiting map[string]chan timing
	// selected is when the watch first showed a waiting PVC with its
	// selected-node annotation.
	selected map[string]time.Time
	watch    watch.Interface
	ended    chan struct{}
}

// newWorkload makes a namespace and watches its PVCs; at cleanup it
// deletes the claims and waits until their volumes are gone, so the next
// pattern starts from the same free space.
func newWorkload(t *testing.T, prefix string) *workload {
	t.Helper()
	ctx := kubetest.Ctx(t, time.Minute)
	w := &workload{
		ns:       fmt.Sprintf("%s-%04x", prefix, rand.IntN(1<<16)),
		made:     map[string]driver{},
		waiting:  map[string]chan timing{},
		selected: map[string]time.Time{},
		ended:    make(chan struct{}),
	}
	if _, err := bed.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", w.ns, err)
	}
	var err error
	if w.watch, err = client.CoreV1().PersistentVolumeClaims(w.ns).Watch(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	go w.run()
	t.Cleanup(func() {
		w.watch.Stop()
		<-w.ended
		if err := deleteVolumes(w.ns); err != nil {
			t.Error(err)
		}
	})
	return w
}

// selectedNode is the annotation the scheduler puts on a
// WaitForFirstConsumer claim once it has chosen the pod's node.
const selectedNode = "volume.kubernetes.io/selected-node"

// timing is one claim's moments: just before its create, when the watch
// first showed its selected node, and when it showed it Bound.
type timing struct{ start, selected, bound time.Time }

// run notes when each waiting PVC first shows its selected node, and hands
// its first Bound event to whoever waits for it.
func (w *workload) run() {
	defer close(w.ended)
	for ev := range w.watch.ResultChan() {
		pvc, ok := ev.Object.(*corev1.PersistentVolumeClaim)
		if !ok || ev.Type == watch.Deleted {
			continue
		}
		now := time.Now()
		w.mu.Lock()
		if ch := w.waiting[pvc.Name]; ch != nil {
			sel, seen := w.selected[pvc.Name]
			if !seen && pvc.Annotations[selectedNode] != "" {
				sel, seen = now, true
				w.selected[pvc.Name] = now
			}
			if pvc.Status.Phase == corev1.ClaimBound {
				if !seen {
					sel = now // Bound in the same event: nothing to split
				}
				ch <- timing{selected: sel, bound: now}
				delete(w.waiting, pvc.Name)
			}
		}
		w.mu.Unlock()
	}
}

// create makes the PVC and its pod for d and returns the time just before
// and where the Bound time will arrive.
func (w *workload) create(ctx context.Context, d driver, name string) (time.Time, <-chan timing, error) {
	ch := make(chan timing, 1)
	w.mu.Lock()
	w.waiting[name] = ch
	w.made[name] = d
	w.mu.Unlock()
	start := time.Now()
	if _, err := client.CoreV1().PersistentVolumeClaims(w.ns).Create(ctx, cluster.NewPVC(w.ns, name, d.storageClass, claimSize), metav1.CreateOptions{}); err != nil {
		return start, nil, fmt.Errorf("create PVC %s: %w", name, err)
	}
	if _, err := client.CoreV1().Pods(w.ns).Create(ctx, cluster.NewPod(w.ns, name, name), metav1.CreateOptions{}); err != nil {
		return start, nil, fmt.Errorf("create pod %s: %w", name, err)
	}
	return start, ch, nil
}

// boundTimeout bounds the wait for one claim; TopoLVM's controller polls
// with a backoff of 1, 2, 4 ... s, so a slow claim takes several seconds.
const boundTimeout = 2 * time.Minute

// oneByOne creates n claims for d one after the other, each once the last
// is Bound, pausing gap after each, and returns their latencies.
func (w *workload) oneByOne(t *testing.T, d driver, prefix string, n int, gap time.Duration) []timing {
	t.Helper()
	ctx := kubetest.Ctx(t, time.Duration(n)*(boundTimeout+gap))
	var out []timing
	for i := range n {
		name := prefix
		if n > 1 {
			name = fmt.Sprintf("%s-%03d", prefix, i)
		}
		start, ch, err := w.create(ctx, d, name)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case x := <-ch:
			x.start = start
			out = append(out, x)
		case <-time.After(boundTimeout):
			t.Fatalf("%s claim %s/%s not Bound within %s; %v", d.name, w.ns, name, boundTimeout, errors.Join(bed.CheckAlive(), peer.checkAlive()))
		case <-w.ended:
			t.Fatalf("the PVC watch of %s ended", w.ns)
		}
		time.Sleep(gap)
	}
	return out
}

// burst creates n claims for d at once (ten creators in parallel) and
// returns each one's timing from its own create.
func (w *workload) burst(t *testing.T, d driver, n int) []timing {
	t.Helper()
	ctx := kubetest.Ctx(t, 2*boundTimeout)
	starts := make([]time.Time, n)
	chans := make([]<-chan timing, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 10 {
		wg.Go(func() {
			for i := range next {
				starts[i], chans[i], errs[i] = w.create(ctx, d, fmt.Sprintf("%s-%03d", short(d), i))
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	out := make([]timing, n)
	deadline := time.After(2 * boundTimeout)
	for i, ch := range chans {
		select {
		case x := <-ch:
			x.start = starts[i]
			out[i] = x
		case <-deadline:
			t.Fatalf("%s burst: claim %d of %d not Bound within %s; %v", d.name, i, n, 2*boundTimeout, errors.Join(bed.CheckAlive(), peer.checkAlive()))
		}
	}
	return out
}

// check asserts that every claim is Bound to a PV of the driver its
// storage class names, on a node of the test bed.
func (w *workload) check(t *testing.T) {
	t.Helper()
	ctx := kubetest.Ctx(t, time.Minute)
	pvcs, err := bed.Client.CoreV1().PersistentVolumeClaims(w.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pvcs.Items) != len(w.made) {
		t.Errorf("namespace %s holds %d PVCs; made %d", w.ns, len(pvcs.Items), len(w.made))
	}
	for _, pvc := range pvcs.Items {
		d := w.made[pvc.Name]
		pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Errorf("PV of %s/%s: %v", w.ns, pvc.Name, err)
			continue
		}
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != d.csiName {
			t.Errorf("PVC %s/%s (class %s) is bound to PV %s of another driver: %+v", w.ns, pvc.Name, d.storageClass, pv.Name, pv.Spec.CSI)
		}
		if node := pvc.Annotations[selectedNode]; bed.Node(node) == nil {
			t.Errorf("PVC %s/%s selected node %q is not a node of the test bed", w.ns, pvc.Name, node)
		}
	}
}

// deleteVolumes force-deletes a namespace's pods (no kubelet confirms),
// deletes its PVCs and waits until their PVs are gone (each driver's
// DeleteVolume done), then deletes the namespace.
func deleteVolumes(ns string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	zero := int64(0)
	cs := bed.Client
	if err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete pods of %s: %w", ns, err)
	}
	if err := cs.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete PVCs of %s: %w", ns, err)
	}
	if err := waitFor(ctx, 4*time.Minute, "the PVs of namespace "+ns+" to be deleted", func(ctx context.Context) (bool, string, error) {
		pvs, err := cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		left := 0
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d left", left), errors.Join(bed.CheckAlive(), peer.checkAlive())
	}); err != nil {
		return err
	}
	return cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
}
