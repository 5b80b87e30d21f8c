//go:build peers

package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// Scale measurement: make bench-peers PEERS_SCALE=10,30,60.
const (
	// scaleClaims per driver at each size: enough for a median of the
	// PVC → Bound time, not a latency study (TestPeersLatency is that).
	scaleClaims = 5
	// scaleVGSize: carve's default class keeps 1 GiB spare, so each
	// driver publishes 1 GiB per node (sparse files: no disk used).
	scaleVGSize = 2 << 30
	// userHZ is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on
	// every Linux architecture the project builds for).
	userHZ = 100
	// settle is the pause after a change (processes started or stopped)
	// before an idle window opens: start-up lists and first capacity
	// writes are not idle cost.
	settle = 15 * time.Second
	// refreshPeriod is carve's --capacity-refresh-interval as shipped:
	// every node agent re-reads LVM on that tick whatever else happens
	// (TopoLVM's agents poll on a period of their own).
	refreshPeriod = time.Minute
)

// refreshWindow is the shortest whole number of refresh periods that
// holds d: windows that long hold one periodic refresh per agent per
// period, so two of them differ only by what happened in them.
func refreshWindow(d time.Duration) time.Duration {
	periods := int64((d + refreshPeriod - 1) / refreshPeriod)
	return time.Duration(periods) * refreshPeriod
}

// scalePoint is everything measured at one cluster size.
type scalePoint struct {
	nodes int
	// bound is the PVC + pod → Bound median per driver.
	bound map[string]time.Duration
	// api is the apiserver in each idle window: "carve" (carve alone),
	// "both", "TopoLVM" (carve stopped), "base" (neither: control plane,
	// snapshot-controller and the Node objects).
	api map[string]apiWindow
	// agents is per process kind (see agentKinds) the per-node median
	// CPU and RSS in the "both" window; central the same for the
	// central processes.
	agents  map[string]usage
	central map[string]usage
	// perNode is each driver's per-node sum of its agents (median over
	// nodes).
	perNode map[string]usage
	// busyPerClaim is the CPU all of a driver's node agents spent per
	// claim (created, Bound, deleted) in the claims' window (from the
	// first claim to a whole number of refresh periods later), either
	// driver's claims counted.
	busyPerClaim map[string]time.Duration
	// busyAboveIdle is busyPerClaim less what the same agents spend idle
	// over a window as long: the work the claims caused, without the
	// periodic LVM refresh every agent does whatever happens, which makes
	// the raw figure grow with N. Both windows are a whole number of
	// carve's refresh periods long (refreshWindow), so each holds the same
	// number of carve's periodic refreshes; TopoLVM's own polling period
	// is not aligned and stays as noise in its figure.
	busyAboveIdle map[string]time.Duration
	// agentWork is what carve's node agents were asked to do in the
	// claims' window, counted from their own metrics.
	agentWork agentWork
}

// agentWork counts, over carve's node agents, the CSI calls they served
// (csi_plugin_operations_seconds, by method, node channel and kubelet
// socket alike) and the LVM commands they ran
// (carve_lvm_command_duration_seconds, by command), and how many agents
// served any call other than the controller's health probes.
type agentWork struct {
	calls, commands map[string]uint64
	agentsCalled    int
}

// mustScrapeAgents is scrapeAgents for a test: a failure fails t.
func mustScrapeAgents(t *testing.T, ctx context.Context) []plugintest.Metrics {
	t.Helper()
	ms, err := scrapeAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// scrapeAgents reads every carve node agent's metrics.
func scrapeAgents(ctx context.Context) ([]plugintest.Metrics, error) {
	var out []plugintest.Metrics
	for _, n := range bed.Nodes {
		ms, err := plugintest.ScrapeURL(ctx, http.DefaultClient, n.MetricsURL)
		if err != nil {
			return nil, fmt.Errorf("metrics of %s's agent: %w", n.Name, err)
		}
		out = append(out, ms)
	}
	return out, nil
}

// agentWorkOf is the work between two scrapes of the same agents.
func agentWorkOf(before, after []plugintest.Metrics) agentWork {
	const calls, cmds = "csi_plugin_operations_seconds", "carve_lvm_command_duration_seconds"
	w := agentWork{calls: map[string]uint64{}, commands: map[string]uint64{}}
	for i := range after {
		called := false
		for _, m := range after[i].LabelValues(calls, "method_name", nil) {
			l := map[string]string{"method_name": m}
			d := after[i].HistogramCount(calls, l) - before[i].HistogramCount(calls, l)
			w.calls[path.Base(m)] += d
			if d > 0 && !strings.HasSuffix(m, "/Probe") && !strings.HasSuffix(m, "/GetPluginInfo") && !strings.HasSuffix(m, "/Inventory") {
				called = true
			}
		}
		if called {
			w.agentsCalled++
		}
		for _, c := range after[i].LabelValues(cmds, "command", nil) {
			l := map[string]string{"command": c}
			w.commands[c] += after[i].HistogramCount(cmds, l) - before[i].HistogramCount(cmds, l)
		}
	}
	return w
}

// String lists the counts, largest first.
func (w agentWork) String() string {
	list := func(m map[string]uint64) string {
		keys := slices.Collect(maps.Keys(m))
		sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
		var parts []string
		for _, k := range keys {
			if m[k] > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
			}
		}
		return strings.Join(parts, ", ")
	}
	return fmt.Sprintf("%d agents served calls beyond probes and inventories; calls: %s; LVM commands: %s", w.agentsCalled, list(w.calls), list(w.commands))
}

// usage is CPU in millicores and resident memory in MiB.
type usage struct{ cpu, rss float64 }

// apiWindow is the apiserver over one idle window.
type apiWindow struct {
	cpu, rss, heap float64 // millicores, MiB, MiB (go_memstats_heap_inuse_bytes at the end)
	etcdCPU        float64 // millicores
	watches        float64 // apiserver_longrunning_requests{verb="WATCH"}
	watchesBy      map[string]float64
	rps            float64 // resource requests per second (apiserver_request_total, resource set)
	rpsBy          map[string]float64
}

// TestPeersScale measures how both drivers' cost grows with the cluster:
// for each size in CARVE_PEERS_SCALE it starts a test bed of that many
// simulated nodes (carve's node agent alone per node and its controller
// Deployment's processes once, then TopoLVM's topolvm-node per node and its
// controller with csi-provisioner), and measures PVC → Bound, the apiserver's CPU, memory,
// watches and request rate in idle windows with carve alone, both, TopoLVM
// alone and neither, each node agent's idle CPU and memory, and the CPU the
// node agents spend per claim. Then it fits y = a + b·N per figure and
// extrapolates to 1000 and 5000 nodes. It asserts only that every claim is
// Bound by its driver and that each driver holds watches.
func TestPeersScale(t *testing.T) {
	var points []scalePoint
	for _, n := range opts.scale {
		ok := t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			points = append(points, measureScale(t, n))
		})
		if !ok {
			break
		}
	}
	report := scaleReport(points)
	for _, l := range report {
		t.Log(l)
		fmt.Println(l)
	}
}

// measureScale runs one size on a test bed of its own and tears it down.
func measureScale(t *testing.T, n int) scalePoint {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cfg := baseCfg
	cfg.Nodes = nil
	for i := range n {
		cfg.Nodes = append(cfg.Nodes, cluster.NodeSpec{Name: fmt.Sprintf("scale-%03d", i), VGSize: scaleVGSize})
	}
	cfg.VGPrefix = fmt.Sprintf("carve-scale-%d-%d", os.Getpid(), n)
	cfg.Lifetime = 30 * time.Minute
	start := time.Now()
	var err error
	bed, err = cluster.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("starting the test bed of %d nodes: %v", n, err)
	}
	peer = nil
	t.Cleanup(func() { stopScaleBed(t) })
	cc := rest.CopyConfig(bed.Control.Config)
	cc.QPS, cc.Burst = 1000, 2000
	if client, err = kubernetes.NewForConfig(cc); err != nil {
		t.Fatal(err)
	}
	capWait := 3*time.Minute + time.Duration(n)*2*time.Second
	if err := waitCapacities(ctx, capWait, carveSide); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes: carve up in %s", n, time.Since(start).Round(time.Millisecond))
	p := scalePoint{nodes: n, api: map[string]apiWindow{}, bound: map[string]time.Duration{}, busyPerClaim: map[string]time.Duration{}, busyAboveIdle: map[string]time.Duration{}}

	// 1. carve alone.
	p.api["carve"], _ = scaleWindow(ctx, t, nil, true)

	// 2. TopoLVM beside it; a handful of claims each, then idle.
	start = time.Now()
	if peer, err = startTopoLVM(ctx, bed, topolvmDir); err != nil {
		t.Fatalf("starting TopoLVM on %d nodes: %v", n, err)
	}
	if err := waitCapacities(ctx, capWait, carveSide, topolvmSide); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes: TopoLVM up in %s", n, time.Since(start).Round(time.Millisecond))
	sleepCtx(ctx, settle)
	agents := agentKinds()
	before := mustSampleAll(t, agents)
	callsBefore := mustScrapeAgents(t, ctx)
	samples := map[string][]time.Duration{}
	claimsStart := time.Now()
	t.Run("claims", func(t *testing.T) {
		w := newWorkload(t, fmt.Sprintf("scale%d", n))
		for i := range scaleClaims {
			order := []driver{carveSide, topolvmSide}
			if i%2 == 1 {
				order = []driver{topolvmSide, carveSide}
			}
			for _, d := range order {
				for _, x := range w.oneByOne(t, d, fmt.Sprintf("%s-%d", short(d), i), 1, time.Second) {
					samples[d.name] = append(samples[d.name], x.bound.Sub(x.start))
				}
			}
		}
		w.check(t)
	})
	if t.Failed() {
		t.FailNow()
	}
	claimsTook := time.Since(claimsStart)
	// The window ends a whole number of refresh periods after it began, so
	// that it holds exactly as many periodic refreshes of each agent as
	// the idle window below, whatever their phase.
	window := refreshWindow(claimsTook)
	sleepCtx(ctx, time.Until(claimsStart.Add(window)))
	after := mustSampleAll(t, agents)
	callsAfter := mustScrapeAgents(t, ctx)
	p.agentWork = agentWorkOf(callsBefore, callsAfter)
	claims := time.Duration(2 * scaleClaims)
	busy := map[*cluster.Process]time.Duration{}
	for _, k := range agents {
		if !k.perNode {
			continue
		}
		for _, pr := range k.procs {
			busy[pr] = time.Duration(after[pr].ticks-before[pr].ticks) * (time.Second / userHZ)
			p.busyPerClaim[k.driver] += busy[pr] / claims
		}
	}
	for _, d := range []driver{carveSide, topolvmSide} {
		p.bound[d.name] = kubetest.Percentile(samples[d.name], 50)
	}
	sleepCtx(ctx, settle)
	// The same agents, as long, asked nothing.
	idleBefore := mustSampleAll(t, agents)
	sleepCtx(ctx, window)
	idleAfter := mustSampleAll(t, agents)
	for _, k := range agents {
		if !k.perNode {
			continue
		}
		for _, pr := range k.procs {
			idle := time.Duration(idleAfter[pr].ticks-idleBefore[pr].ticks) * (time.Second / userHZ)
			p.busyAboveIdle[k.driver] += (busy[pr] - idle) / claims
		}
	}
	t.Logf("%d nodes: the claims took %s, in a window of %s", n, claimsTook.Round(time.Millisecond), window)
	var use map[*cluster.Process]usage
	p.api["both"], use = scaleWindow(ctx, t, agents, true)
	p.agents, p.central, p.perNode = summarize(agents, use)

	// 3. carve stopped: TopoLVM alone.
	var carveProcs []*cluster.Process
	for _, k := range agents {
		if k.driver == carveSide.name {
			carveProcs = append(carveProcs, k.procs...)
		}
	}
	stopAll(carveProcs)
	sleepCtx(ctx, settle)
	p.api["TopoLVM"], _ = scaleWindow(ctx, t, nil, false)

	// 4. Neither.
	stopAll(peer.processes())
	sleepCtx(ctx, settle)
	p.api["base"], _ = scaleWindow(ctx, t, nil, false)
	for _, d := range []string{"carve", "TopoLVM"} {
		if w := p.api[d].watches - p.api["base"].watches; w <= 0 {
			t.Errorf("%d nodes: %s holds %.0f watches on the apiserver beyond the control plane's; a driver that watches nothing is not running", n, d, w)
		}
	}
	for _, l := range pointLines(p) {
		t.Log(l)
		fmt.Println(l)
	}
	return p
}

// stopScaleBed tears the size's test bed down and removes its run
// directory unless the run failed or CARVE_PEERS_KEEP_LOGS is set.
func stopScaleBed(t *testing.T) {
	if t.Failed() {
		bed.DumpLogs(20)
	}
	if err := bed.Stop(); err != nil {
		t.Errorf("tearing the test bed down: %v", err)
	}
	if peer != nil {
		if err := peer.closeVGs(); err != nil {
			t.Errorf("removing TopoLVM's volume groups: %v", err)
		}
	}
	if !t.Failed() && os.Getenv("CARVE_PEERS_KEEP_LOGS") == "" {
		if err := os.RemoveAll(bed.Config.RunDir); err != nil {
			t.Logf("removing the run directory: %v", err)
		}
	} else {
		t.Logf("logs kept in %s", bed.Config.RunDir)
	}
	bed, peer = nil, nil
}

// agentKind is one kind of process a driver runs: per node (one process
// per node) or central.
type agentKind struct {
	name    string
	driver  string
	perNode bool
	procs   []*cluster.Process
}

// agentKinds lists both drivers' processes on the running test bed.
// node-driver-registrar and the liveness probes do not run here (the
// harness writes what registration would), for either driver.
func agentKinds() []agentKind {
	var plugin, tvNode []*cluster.Process
	for _, n := range bed.Nodes {
		plugin = append(plugin, n.Plugin())
		tvNode = append(tvNode, peer.nodes[n.Name].Process)
	}
	// carve's node agent runs alone on each node; its sidecars run once,
	// beside carve controller (issue 21).
	central := func(p *cluster.Process) []*cluster.Process {
		if p == nil {
			return nil
		}
		return []*cluster.Process{p}
	}
	kinds := []agentKind{
		{"carve node", carveSide.name, true, plugin},
		{"topolvm-node", topolvmSide.name, true, tvNode},
		{"carve controller", carveSide.name, false, central(bed.Central.Controller())},
		{"csi-provisioner (carve, central)", carveSide.name, false, central(bed.Central.Provisioner())},
		{"csi-snapshotter (carve, central)", carveSide.name, false, central(bed.Central.Snapshotter())},
		{"csi-resizer (carve, central)", carveSide.name, false, central(bed.Central.Resizer())},
		{"topolvm-controller", topolvmSide.name, false, []*cluster.Process{peer.controller}},
		{"csi-provisioner (TopoLVM, central)", topolvmSide.name, false, []*cluster.Process{peer.provisioner}},
	}
	return slices.DeleteFunc(kinds, func(k agentKind) bool { return len(k.procs) == 0 })
}

// summarize turns one window's usage into per-kind medians over nodes,
// central figures and each driver's per-node sum.
func summarize(kinds []agentKind, use map[*cluster.Process]usage) (agents, central, perNode map[string]usage) {
	agents, central, perNode = map[string]usage{}, map[string]usage{}, map[string]usage{}
	sums := map[string]map[int]usage{} // driver → node index → sum
	for _, k := range kinds {
		if !k.perNode {
			central[k.name] = use[k.procs[0]]
			continue
		}
		var cpu, rss []float64
		if sums[k.driver] == nil {
			sums[k.driver] = map[int]usage{}
		}
		for i, p := range k.procs {
			u := use[p]
			cpu, rss = append(cpu, u.cpu), append(rss, u.rss)
			s := sums[k.driver][i]
			sums[k.driver][i] = usage{s.cpu + u.cpu, s.rss + u.rss}
		}
		agents[k.name] = usage{median(cpu), median(rss)}
	}
	for d, byNode := range sums {
		var cpu, rss []float64
		for _, u := range byNode {
			cpu, rss = append(cpu, u.cpu), append(rss, u.rss)
		}
		perNode[d] = usage{median(cpu), median(rss)}
	}
	return agents, central, perNode
}

// procSample is one reading of /proc/<pid>/stat: CPU ticks of the process
// and its reaped children (the LVM commands a node agent runs), and its
// resident memory.
type procSample struct {
	ticks uint64
	rss   uint64 // bytes
}

// readProc reads /proc/<pid>/stat.
func readProc(pid int) (procSample, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procSample{}, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 > len(data) {
		return procSample{}, fmt.Errorf("/proc/%d/stat: no ')' in %q", pid, data)
	}
	f := strings.Fields(string(data[i+2:]))
	// f[0] is field 3 (state); utime, stime, cutime, cstime are fields
	// 14-17, rss (pages) field 24.
	if len(f) < 22 {
		return procSample{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var s procSample
	for _, j := range []int{11, 12, 13, 14} {
		v, err := strconv.ParseUint(f[j], 10, 64)
		if err != nil {
			return procSample{}, fmt.Errorf("/proc/%d/stat field %d: %w", pid, j+3, err)
		}
		s.ticks += v
	}
	pages, err := strconv.ParseUint(f[21], 10, 64)
	if err != nil {
		return procSample{}, fmt.Errorf("/proc/%d/stat rss: %w", pid, err)
	}
	s.rss = pages * uint64(os.Getpagesize())
	return s, nil
}

// mustSampleAll is sampleAll for a test: a failure fails t.
func mustSampleAll(t *testing.T, kinds []agentKind) map[*cluster.Process]procSample {
	t.Helper()
	samples, err := sampleAll(kinds)
	if err != nil {
		t.Fatal(err)
	}
	return samples
}

// sampleAll reads every process of kinds.
func sampleAll(kinds []agentKind) (map[*cluster.Process]procSample, error) {
	out := map[*cluster.Process]procSample{}
	for _, k := range kinds {
		for _, p := range k.procs {
			s, err := readProc(p.Pid())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.Name, err)
			}
			out[p] = s
		}
	}
	return out, nil
}

// scaleWindow watches the test bed for opts.scaleIdle with nothing asked of it:
// the apiserver's (and etcd's) CPU, its memory, watches and request rate,
// and the CPU and memory of every process of kinds.
// alive: every process the test bed started must still run (false once
// some were stopped on purpose).
func scaleWindow(ctx context.Context, t *testing.T, kinds []agentKind, alive bool) (apiWindow, map[*cluster.Process]usage) {
	t.Helper()
	api, etcd := bed.Control.Process("kube-apiserver"), bed.Control.Process("etcd")
	control := []agentKind{{name: "control plane", procs: []*cluster.Process{api, etcd}}}
	all := append(slices.Clone(kinds), control...)
	m0, err := apiMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s0, err := sampleAll(all)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	sleepCtx(ctx, opts.scaleIdle)
	s1, err := sampleAll(all)
	if err != nil {
		t.Fatal(err)
	}
	secs := time.Since(t0).Seconds()
	m1, err := apiMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if alive {
		if err := errors.Join(bed.CheckAlive(), peerAlive()); err != nil {
			t.Fatal(err)
		}
	}
	use := map[*cluster.Process]usage{}
	for p, b := range s0 {
		a := s1[p]
		use[p] = usage{cpu: float64(a.ticks-b.ticks) / userHZ / secs * 1000, rss: float64(a.rss) / (1 << 20)}
	}
	w := apiWindow{cpu: use[api].cpu, rss: use[api].rss, etcdCPU: use[etcd].cpu, rpsBy: map[string]float64{}}
	w.heap = sum(m1, "go_memstats_heap_inuse_bytes") / (1 << 20)
	var watchOK bool
	w.watchesBy, watchOK = sumBy(m1, "apiserver_longrunning_requests", func(l map[string]string) string {
		if l["verb"] != "WATCH" {
			return ""
		}
		return l["resource"]
	})
	if !watchOK {
		t.Fatal("the apiserver's /metrics has no apiserver_longrunning_requests")
	}
	for _, v := range w.watchesBy {
		w.watches += v
	}
	resource := func(l map[string]string) string {
		if l["resource"] == "" {
			return "" // /metrics, /readyz: the harness's own
		}
		return l["verb"] + " " + l["resource"]
	}
	after, ok1 := sumBy(m1, "apiserver_request_total", resource)
	beforeReq, ok0 := sumBy(m0, "apiserver_request_total", resource)
	if !ok0 || !ok1 {
		t.Fatal("the apiserver's /metrics has no apiserver_request_total")
	}
	for k, v := range after {
		if d := (v - beforeReq[k]) / secs; d > 0 {
			w.rpsBy[k] = d
			w.rps += d
		}
	}
	return w, use
}

// apiMetrics scrapes the apiserver's /metrics as the admin.
func apiMetrics(ctx context.Context) (plugintest.Metrics, error) {
	raw, err := bed.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("the apiserver's /metrics: %w", err)
	}
	return plugintest.ParseMetrics(bytes.NewReader(raw))
}

// sumBy sums the gauge or counter series of name by key(labels); series
// whose key is "" are left out. ok is false when there is no such family.
func sumBy(ms plugintest.Metrics, name string, key func(map[string]string) string) (map[string]float64, bool) {
	fam, ok := ms[name]
	if !ok {
		return nil, false
	}
	out := map[string]float64{}
	for _, m := range fam.GetMetric() {
		if k := key(labelMap(m)); k != "" {
			out[k] += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return out, true
}

// sum is the total of name's series.
func sum(ms plugintest.Metrics, name string) float64 {
	by, _ := sumBy(ms, name, func(map[string]string) string { return "all" })
	return by["all"]
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// peerAlive is peer.checkAlive when TopoLVM runs.
func peerAlive() error {
	if peer == nil {
		return nil
	}
	return peer.checkAlive()
}

// stopAll stops the processes (each by its own pid) at once.
func stopAll(ps []*cluster.Process) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(p.Stop)
	}
	wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	return s[(len(s)-1)/2]
}

// figure is one measured quantity per driver across sizes.
type figure struct {
	name, unit string
	value      func(p scalePoint, d string) float64
	// total, when set, is the cluster-wide cost at n nodes from the
	// fitted per-node value y(n): n·y(n) for a per-node agent.
	total bool
}

// figures are what the scale report fits and extrapolates.
func figures() []figure {
	// attributed is the apiserver figure of the window with d alone,
	// less the window with neither.
	attributed := func(f func(apiWindow) float64) func(scalePoint, string) float64 {
		return func(p scalePoint, d string) float64 { return f(p.api[d]) - f(p.api["base"]) }
	}
	// added is, for memory (which the apiserver does not give back when
	// a client leaves): carve's window alone for carve, and what
	// TopoLVM's start added on top of that for TopoLVM.
	added := func(f func(apiWindow) float64) func(scalePoint, string) float64 {
		return func(p scalePoint, d string) float64 {
			if d == carveSide.name {
				return f(p.api["carve"])
			}
			return f(p.api["both"]) - f(p.api["carve"])
		}
	}
	return []figure{
		{name: "PVC+pod -> Bound median", unit: "ms", value: func(p scalePoint, d string) float64 { return float64(p.bound[d].Microseconds()) / 1000 }},
		{name: "apiserver CPU idle, the driver's share", unit: "mcores", value: attributed(func(w apiWindow) float64 { return w.cpu })},
		{name: "etcd CPU idle, the driver's share", unit: "mcores", value: attributed(func(w apiWindow) float64 { return w.etcdCPU })},
		{name: "apiserver watches, the driver's", unit: "watches", value: attributed(func(w apiWindow) float64 { return w.watches })},
		{name: "apiserver requests idle, the driver's", unit: "req/s", value: attributed(func(w apiWindow) float64 { return w.rps })},
		{name: "apiserver RSS (carve: carve alone; TopoLVM: added on top)", unit: "MiB", value: added(func(w apiWindow) float64 { return w.rss })},
		{name: "apiserver heap in use (carve: carve alone; TopoLVM: added on top)", unit: "MiB", value: added(func(w apiWindow) float64 { return w.heap })},
		{name: "node agents per node, CPU idle (median node)", unit: "mcores", value: func(p scalePoint, d string) float64 { return p.perNode[d].cpu }, total: true},
		{name: "node agents per node, RSS (median node)", unit: "MiB", value: func(p scalePoint, d string) float64 { return p.perNode[d].rss }, total: true},
		{name: "CPU of all node agents per claim", unit: "ms", value: func(p scalePoint, d string) float64 { return float64(p.busyPerClaim[d].Microseconds()) / 1000 }},
		{name: "CPU of all node agents per claim, above their idle", unit: "ms", value: func(p scalePoint, d string) float64 { return float64(p.busyAboveIdle[d].Microseconds()) / 1000 }},
	}
}

// pointLines prints one size's figures.
func pointLines(p scalePoint) []string {
	var out []string
	for _, f := range figures() {
		out = append(out, fmt.Sprintf("scale N=%d %s: carve %.2f %s / TopoLVM %.2f %s", p.nodes, f.name, f.value(p, "carve"), f.unit, f.value(p, "TopoLVM"), f.unit))
	}
	out = append(out, fmt.Sprintf("scale N=%d carve node agents in the claims' window (%d carve claims): %s", p.nodes, scaleClaims, p.agentWork))
	for _, ph := range []string{"carve", "both", "TopoLVM", "base"} {
		w := p.api[ph]
		out = append(out, fmt.Sprintf("scale N=%d apiserver window %s: CPU %.1f mcores, RSS %.0f MiB, heap %.0f MiB, etcd CPU %.1f mcores, %.0f watches %s, %.2f req/s %s",
			p.nodes, ph, w.cpu, w.rss, w.heap, w.etcdCPU, w.watches, top(w.watchesBy, 8, "%.0f"), w.rps, top(w.rpsBy, 8, "%.2f")))
	}
	for _, m := range []map[string]usage{p.agents, p.central} {
		names := slices.Sorted(maps.Keys(m))
		for _, k := range names {
			out = append(out, fmt.Sprintf("scale N=%d process %s: CPU %.2f mcores, RSS %.1f MiB", p.nodes, k, m[k].cpu, m[k].rss))
		}
	}
	return out
}

// top lists the n largest entries of m.
func top(m map[string]float64, n int, format string) string {
	keys := slices.Sorted(maps.Keys(m))
	sort.SliceStable(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	var parts []string
	for _, k := range keys[:min(n, len(keys))] {
		parts = append(parts, k+"="+fmt.Sprintf(format, m[k]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// fit is the least-squares line y = a + b·x.
func fit(xs, ys []float64) (a, b float64, err error) {
	if len(xs) < 2 {
		return 0, 0, errors.New("one size only")
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(len(xs))
	my /= float64(len(xs))
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return 0, 0, errors.New("all sizes equal")
	}
	b = sxy / sxx
	return my - b*mx, b, nil
}

// scaleReport fits each figure over the sizes and extrapolates.
func scaleReport(points []scalePoint) []string {
	var out []string
	xs := make([]float64, len(points))
	for i, p := range points {
		xs[i] = float64(p.nodes)
	}
	for _, f := range figures() {
		for _, d := range []string{"carve", "TopoLVM"} {
			ys := make([]float64, len(points))
			vals := make([]string, len(points))
			for i, p := range points {
				ys[i] = f.value(p, d)
				vals[i] = fmt.Sprintf("%.2f@%d", ys[i], p.nodes)
			}
			a, b, err := fit(xs, ys)
			if err != nil {
				out = append(out, fmt.Sprintf("scale model %s, %s: %s %s (%v)", f.name, d, strings.Join(vals, " "), f.unit, err))
				continue
			}
			line := fmt.Sprintf("scale model %s, %s: measured %s %s; fit %.3f + %.5f·N; N=1000: %.1f; N=5000: %.1f",
				f.name, d, strings.Join(vals, " "), f.unit, a, b, a+b*1000, a+b*5000)
			if f.total {
				line += fmt.Sprintf("; whole cluster N·(a+b·N): N=1000: %.0f, N=5000: %.0f", 1000*(a+b*1000), 5000*(a+b*5000))
			}
			out = append(out, line)
		}
	}
	return out
}
