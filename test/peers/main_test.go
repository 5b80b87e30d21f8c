//go:build peers

package peers

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/test/harness/cluster"
)

// The test bed both drivers share; TestMain starts and stops it.
var (
	bed  *cluster.Cluster
	peer *topolvm
	opts options
	// client makes the workload's objects without client-side rate
	// limits: client-go's default (5 requests/s, burst 10) would itself
	// spread a burst of claims over seconds.
	client kubernetes.Interface
	// baseCfg and topolvmDir are what configFromEnv found; the scale
	// measurement starts a test bed of its own per size from them.
	baseCfg    cluster.Config
	topolvmDir string
)

// options are the knobs of a run, from the environment (make bench-peers
// passes them through).
type options struct {
	// claims per driver and pattern (CARVE_PEERS_CLAIMS, default 50).
	claims int
	// gap after each Bound in the paced pattern (CARVE_PEERS_GAP, 1s).
	gap time.Duration
	// freshnessCap bounds the wait for an outside change to show in the
	// CSIStorageCapacity objects (CARVE_PEERS_FRESHNESS_CAP, 90s).
	freshnessCap time.Duration
	// idleVolumes are the volume counts TestPeersIdle measures at, in
	// order (CARVE_PEERS_IDLE_VOLUMES, comma-separated, default 100; 0
	// skips it), each for idleWindow (CARVE_PEERS_IDLE_WINDOW, 2m).
	idleVolumes []int
	idleWindow  time.Duration
	// scale lists the node counts of the scale measurement
	// (CARVE_PEERS_SCALE, e.g. "10,30,60"); when set, the run is that
	// measurement alone (TestPeersScale), each size on a test bed of its
	// own.
	scale []int
	// idle is each idle window of the scale measurement
	// (CARVE_PEERS_SCALE_IDLE, 40s).
	scaleIdle time.Duration
}

func TestMain(m *testing.M) {
	klog.InitFlags(nil)
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	baseCfg, topolvmDir, err = configFromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: bench-peers cannot run: %v\n", err)
		return 1
	}
	cfg := baseCfg
	// The scale measurement starts its own test beds; the other tests
	// share the three-node one below. Either run selects its tests here,
	// so that none is skipped.
	if len(opts.scale) > 0 {
		if err := flag.Set("test.run", "^TestPeersScale$"); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			return 1
		}
		return m.Run()
	}
	if err := flag.Set("test.skip", "^TestPeersScale$"); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Lifetime)
	defer cancel()
	start := time.Now()
	bed, err = cluster.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: starting the test bed: %v\n", err)
		return 1
	}
	var code int
	cc := rest.CopyConfig(bed.Control.Config)
	cc.QPS, cc.Burst = 1000, 2000
	if client, err = kubernetes.NewForConfig(cc); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: client: %v\n", err)
		return 1
	}
	peer, err = startTopoLVM(ctx, bed, topolvmDir)
	if err == nil {
		err = waitCapacities(ctx, 3*time.Minute, carveSide, topolvmSide)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: starting TopoLVM: %v\n", err)
		code = 1
	} else {
		fmt.Printf("peers: test bed up in %s: control plane, %d simulated nodes each with carve's node agent (carve node alone, deploy/kubernetes flags; carve controller and its sidecars run once) and TopoLVM (topolvm-node, lvmd embedded) on loop-device VGs of the same size; TopoLVM's controller and central csi-provisioner (its chart's flags); run directory %s\n",
			time.Since(start).Round(time.Millisecond), len(bed.Nodes), bed.Config.RunDir)
		code = m.Run()
	}
	if code != 0 {
		bed.DumpLogs(30)
	}
	if err := bed.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: tearing the test bed down: %v\n", err)
		code = 1
	}
	if peer != nil {
		if err := peer.closeVGs(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: removing TopoLVM's volume groups: %v\n", err)
			code = 1
		}
	}
	if code == 0 && os.Getenv("CARVE_PEERS_KEEP_LOGS") == "" {
		if err := os.RemoveAll(bed.Config.RunDir); err != nil {
			fmt.Fprintf(os.Stderr, "peers: removing the run directory: %v\n", err)
		}
	} else {
		fmt.Fprintf(os.Stderr, "peers: logs kept in %s\n", bed.Config.RunDir)
	}
	return code
}

// configFromEnv reads the binaries' places (CARVE_E2E_BIN, CARVE_BIN,
// CARVE_TOPOLVM: the directories hack/e2e-tools.sh and hack/topolvm.sh
// print, and bin/carve) and the run's options.
func configFromEnv() (cluster.Config, string, error) {
	binDir, carve, topolvmDir := os.Getenv("CARVE_E2E_BIN"), os.Getenv("CARVE_BIN"), os.Getenv("CARVE_TOPOLVM")
	if binDir == "" || carve == "" || topolvmDir == "" {
		return cluster.Config{}, "", fmt.Errorf("CARVE_E2E_BIN (hack/e2e-tools.sh), CARVE_BIN (make build) and CARVE_TOPOLVM (hack/topolvm.sh) must be set; run `make bench-peers` as root")
	}
	if _, err := os.Stat(filepath.Join(topolvmDir, "hypertopolvm")); err != nil {
		return cluster.Config{}, "", fmt.Errorf("CARVE_TOPOLVM: %w (hack/topolvm.sh builds it)", err)
	}
	opts = options{claims: 50, gap: time.Second, freshnessCap: 90 * time.Second, idleVolumes: []int{100}, idleWindow: 2 * time.Minute, scaleIdle: 40 * time.Second}
	if v := os.Getenv("CARVE_PEERS_IDLE_VOLUMES"); v != "" {
		opts.idleVolumes = nil
		last := 0
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 || n > 2000 || (n > 0 && n <= last) {
				return cluster.Config{}, "", fmt.Errorf("CARVE_PEERS_IDLE_VOLUMES %q: want rising whole numbers from 1 to 2000, comma-separated, or 0", v)
			}
			if n > 0 {
				opts.idleVolumes, last = append(opts.idleVolumes, n), n
			}
		}
	}
	if v := os.Getenv("CARVE_PEERS_SCALE"); v != "" {
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 200 {
				return cluster.Config{}, "", fmt.Errorf("CARVE_PEERS_SCALE %q: want node counts from 1 to 200, comma-separated (e.g. 10,30,60)", v)
			}
			opts.scale = append(opts.scale, n)
		}
	}
	if v := os.Getenv("CARVE_PEERS_CLAIMS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 || n > 200 {
			return cluster.Config{}, "", fmt.Errorf("CARVE_PEERS_CLAIMS %q: want a whole number from 2 to 200", v)
		}
		opts.claims = n
	}
	for _, d := range []struct {
		env string
		to  *time.Duration
	}{{"CARVE_PEERS_GAP", &opts.gap}, {"CARVE_PEERS_FRESHNESS_CAP", &opts.freshnessCap}, {"CARVE_PEERS_IDLE_WINDOW", &opts.idleWindow}, {"CARVE_PEERS_SCALE_IDLE", &opts.scaleIdle}} {
		if v := os.Getenv(d.env); v != "" {
			dur, err := time.ParseDuration(v)
			if err != nil || dur < 0 || dur > 10*time.Minute {
				return cluster.Config{}, "", fmt.Errorf("%s %q: want a duration from 0s to 10m", d.env, v)
			}
			*d.to = dur
		}
	}
	// CARVE_PEERS_DEPLOY: another copy of deploy/kubernetes, to measure
	// other DaemonSet flags against the same peer.
	deploy := os.Getenv("CARVE_PEERS_DEPLOY")
	if deploy == "" {
		var err error
		if deploy, err = filepath.Abs(filepath.Join("..", "..", "deploy", "kubernetes")); err != nil {
			return cluster.Config{}, "", err
		}
	}
	cfg := cluster.Config{
		BinDir:    binDir,
		CarveBin:  carve,
		DeployDir: deploy,
		Nodes:     cluster.ThreeNodes(),
		Lifetime:  40 * time.Minute,
	}
	return cfg, topolvmDir, cluster.Requirements(cfg)
}

// waitCapacities waits until the drivers in sides publish capacity for
// every node of the test bed.
func waitCapacities(ctx context.Context, timeout time.Duration, sides ...driver) error {
	return waitFor(ctx, timeout, "capacity for every node", func(ctx context.Context) (bool, string, error) {
		list, err := bed.Client.StorageV1().CSIStorageCapacities("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		have := map[string]bool{}
		for _, c := range list.Items {
			for _, d := range sides {
				if c.StorageClassName == d.storageClass && c.NodeTopology != nil && c.Capacity != nil && c.Capacity.Value() > 0 {
					have[d.name+" on "+c.NodeTopology.MatchLabels[topologyKey(d)]] = true
				}
			}
		}
		var missing []string
		for _, n := range bed.Nodes {
			for _, d := range sides {
				if k := d.name + " on " + n.Name; !have[k] {
					missing = append(missing, k)
				}
			}
		}
		alive := bed.CheckAlive()
		if peer != nil {
			alive = errors.Join(alive, peer.checkAlive())
		}
		return len(missing) == 0, fmt.Sprintf("%d missing, first %s", len(missing), strings.Join(missing[:min(len(missing), 5)], ", ")), alive
	})
}
