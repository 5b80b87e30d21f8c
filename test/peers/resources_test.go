//go:build peers

package peers

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// finale runs TestPeersIdle after the other tests: its many volumes then
// weigh on no other measurement, and it measures node agents that the
// latency patterns have used.
var finale = kubetest.NewFinale("TestPeersIdle")

// idleNode is the node whose agents TestPeersIdle measures: the largest,
// so that 1000 volumes of one extent fit.
const idleNode = "node-large"

// TestPeersIdle measures each driver's node agent while idle with many
// volumes on its node, the same way carve's own figures were first
// measured: volumes made with lvcreate as the driver makes them (carve's
// with its tags), then a quiet window in which nothing is asked of either
// driver. For each count of opts.idleVolumes it prints the LVM commands
// run per minute (carve: its carve_lvm_command_duration_seconds count;
// TopoLVM: the lines lvmcount wrote) and the resident memory (VmRSS, and
// VmHWM as the peak) of carve's plugin (alone on its node) and
// topolvm-node, and of carve's central processes. It runs after the other tests (finale), and its volumes
// are removed at the end. It asserts that carve's view holds the
// volumes and that the counting works (topolvm-node ran LVM commands at
// start).
func TestPeersIdle(t *testing.T) {
	finale.Enter(t)
	if len(opts.idleVolumes) == 0 {
		t.Skip("CARVE_PEERS_IDLE_VOLUMES=0: not measured")
	}
	n := bed.Node(idleNode)
	tv := peer.nodes[idleNode]
	if n == nil || tv == nil {
		t.Fatalf("no node %s on the test bed", idleNode)
	}
	class := ""
	for _, c := range bed.DeviceClasses.DeviceClasses {
		if c.Default && !c.Thin() {
			class = c.Name
		}
	}
	if lines, err := countLines(tv.LVMLog, time.Time{}, time.Now()); err != nil || lines == 0 {
		t.Fatalf("lvmcount noted no LVM command of topolvm-node (%d, %v): the count would be meaningless", lines, err)
	}
	var made []string
	t.Cleanup(func() {
		// One lvremove per group removes them all.
		ctx := kubetest.Ctx(t, 5*time.Minute)
		for _, vg := range []*lvmtest.LoopVG{n.VG, tv.VG} {
			args := []string{"lvremove", "--yes"}
			for _, lv := range made {
				args = append(args, vg.Name+"/"+lv)
			}
			if len(made) > 0 {
				if _, err := vg.LVM(ctx, args...); err != nil {
					t.Errorf("removing the idle volumes of %s: %v", vg.Name, err)
				}
			}
		}
	})
	for _, want := range opts.idleVolumes {
		ctx := kubetest.Ctx(t, 30*time.Minute)
		start := time.Now()
		var names []string
		for i := len(made); i < want; i++ {
			names = append(names, fmt.Sprintf("idle-%04d", i))
		}
		if err := makeIdleVolumes(ctx, names, n.VG, tv.VG, class); err != nil {
			t.Fatal(err)
		}
		made = append(made, names...)
		t.Logf("made %d more LVs in each group in %s", len(names), time.Since(start).Round(time.Second))

		// carve's view takes them in on the refresh the backup watch sets
		// off; then both sides are left alone.
		kubetest.Poll(t, time.Second, 5*time.Minute, fmt.Sprintf("carve's view to hold %d volumes", want), func(ctx context.Context) (bool, string, error) {
			ms, err := plugintest.ScrapeURL(ctx, http.DefaultClient, n.MetricsURL)
			if err != nil {
				return false, "", err
			}
			v, _, err := ms.Gauge("carve_volumes", map[string]string{"device_class": class})
			return v >= float64(want), fmt.Sprintf("carve_volumes %v", v), err
		}, nil)
		time.Sleep(5 * time.Second) // the refresh's own tail

		before, err := plugintest.ScrapeURL(ctx, http.DefaultClient, n.MetricsURL)
		if err != nil {
			t.Fatal(err)
		}
		memBefore := agentMemory(t, n.Plugin().Pid(), tv.Process.Pid())
		from := time.Now()
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(opts.idleWindow):
		}
		to := time.Now()
		after, err := plugintest.ScrapeURL(ctx, http.DefaultClient, n.MetricsURL)
		if err != nil {
			t.Fatal(err)
		}
		memAfter := agentMemory(t, n.Plugin().Pid(), tv.Process.Pid())
		if err := errors.Join(bed.CheckAlive(), peer.checkAlive()); err != nil {
			t.Fatal(err)
		}
		const cmds = "carve_lvm_command_duration_seconds"
		carveCount := after.HistogramCount(cmds, nil) - before.HistogramCount(cmds, nil)
		var carveBy []string
		for _, c := range after.LabelValues(cmds, "command", nil) {
			l := map[string]string{"command": c}
			if d := after.HistogramCount(cmds, l) - before.HistogramCount(cmds, l); d > 0 {
				carveBy = append(carveBy, fmt.Sprintf("%s %d", c, d))
			}
		}
		tvCmds, err := countLines(tv.LVMLog, from, to)
		if err != nil {
			t.Fatal(err)
		}
		minutes := to.Sub(from).Minutes()
		fmt.Printf("ratio carve/TopoLVM idle LVM commands per minute, %d volumes on %s: carve %.2f (%d in %s: %s), TopoLVM %.2f (%d)%s\n",
			want, idleNode, float64(carveCount)/minutes, carveCount, to.Sub(from).Round(time.Second), strings.Join(carveBy, ", "),
			float64(tvCmds)/minutes, tvCmds, ratioText(float64(carveCount), float64(tvCmds)))
		fmt.Printf("ratio carve/TopoLVM node agent resident memory, %d volumes: %.2f (carve node, alone on the node, %s after the window, peak %s, at the window's start %s; "+
			"topolvm-node (lvmd embedded) %s, peak %s, at the window's start %s)\n",
			want, memAfter[0].rss/memAfter[1].rss, mib(memAfter[0].rss), mib(memAfter[0].hwm), mib(memBefore[0].rss),
			mib(memAfter[1].rss), mib(memAfter[1].hwm), mib(memBefore[1].rss))
		fmt.Printf("peers: resident memory after the window, %d volumes, anonymous + mapped files: carve node %s + %s (Go heap in use %s, heap released to the OS %s, heap idle %s, stacks %s, from its /metrics); "+
			"topolvm-node %s + %s; carve's central processes, once for the cluster: %s\n",
			want, mib(memAfter[0].anon), mib(memAfter[0].file), goMem(after, "heap_inuse"), goMem(after, "heap_released"), goMem(after, "heap_idle"), goMem(after, "stack_inuse"),
			mib(memAfter[1].anon), mib(memAfter[1].file), centralMemory(t))
	}
}

// centralMemory is the resident memory of each of carve's central
// processes (carve controller and its sidecars), which run once whatever
// the number of nodes.
func centralMemory(t *testing.T) string {
	t.Helper()
	var parts []string
	for _, p := range []struct {
		name string
		proc *cluster.Process
	}{
		{"carve controller", bed.Central.Controller()}, {"csi-provisioner", bed.Central.Provisioner()},
		{"csi-snapshotter", bed.Central.Snapshotter()}, {"csi-resizer", bed.Central.Resizer()},
	} {
		if p.proc == nil {
			continue
		}
		m := agentMemory(t, p.proc.Pid())[0]
		parts = append(parts, fmt.Sprintf("%s %s", p.name, mib(m.rss)))
	}
	return strings.Join(parts, ", ")
}

// makeIdleVolumes makes an LV of one extent per name in both groups, the
// two groups at once: carve's with the tags CreateVolume puts on, TopoLVM's
// as lvmd makes them (no tags). Activation is off on the test bed.
func makeIdleVolumes(ctx context.Context, names []string, carveVG, topolvmVG *lvmtest.LoopVG, class string) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, vg := range []*lvmtest.LoopVG{carveVG, topolvmVG} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, name := range names {
				args := []string{"lvcreate", "--yes", "--activate", "n", "--zero", "n", "--wipesignatures", "n", "--name", name, "--size", "4m"}
				if vg == carveVG {
					args = append(args, "--addtag", volume.TagOwner, "--addtag", volume.TagClassPrefix+class, "--addtag", volume.TagNamePrefix+name)
				}
				if _, err := vg.LVM(ctx, append(args, vg.Name)...); err != nil {
					errs[i] = fmt.Errorf("lvcreate %s in %s: %w", name, vg.Name, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// countLines counts the lines of an lvmcount log whose time is in
// [from, to).
func countLines(path string, from, to time.Time) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		ts, _, _ := strings.Cut(sc.Text(), " ")
		ns, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: line %q", path, sc.Text())
		}
		if at := time.Unix(0, ns); !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n, sc.Err()
}

// memory is a process's resident set now and its peak, and the resident
// set's two parts: anonymous memory (the Go heap, stacks, the runtime's
// own) and pages of mapped files (its executable's code and read-only
// data, shared with the page cache), in bytes.
type memory struct{ rss, hwm, anon, file float64 }

// agentMemory reads VmRSS, VmHWM, RssAnon and RssFile of each pid.
func agentMemory(t *testing.T, pids ...int) []memory {
	t.Helper()
	var out []memory
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatalf("reading the memory of process %d: %v", pid, err)
		}
		var m memory
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) != 3 || f[2] != "kB" {
				continue
			}
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				continue
			}
			switch f[0] {
			case "VmRSS:":
				m.rss = v * 1024
			case "VmHWM:":
				m.hwm = v * 1024
			case "RssAnon:":
				m.anon = v * 1024
			case "RssFile:":
				m.file = v * 1024
			}
		}
		if m.rss == 0 {
			t.Fatalf("process %d: no VmRSS in /proc/%d/status", pid, pid)
		}
		out = append(out, m)
	}
	return out
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// goMem is the Go runtime's go_memstats_<what>_bytes in ms, in MiB.
func goMem(ms plugintest.Metrics, what string) string {
	v, ok, err := ms.Gauge("go_memstats_"+what+"_bytes", nil)
	if err != nil || !ok {
		return fmt.Sprintf("no go_memstats_%s_bytes (%v)", what, err)
	}
	return mib(v)
}

// ratioText is ", ratio x" or, when b is 0, what the ratio cannot say.
func ratioText(a, b float64) string {
	if b == 0 {
		return "; no ratio: TopoLVM ran none in the window"
	}
	return fmt.Sprintf("; ratio %.2f", a/b)
}
