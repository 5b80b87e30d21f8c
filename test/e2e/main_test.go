//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/test/e2e/cluster"
)

// bed is the test bed every scenario shares; TestMain starts and stops it.
var bed *cluster.Cluster

// The test bed's audit: a short grace period so that orphans show within
// seconds (the shipped default is 10 minutes).
const (
	orphanGrace   = 12 * time.Second
	auditInterval = 2 * time.Second
	// refreshInterval lets the view see an LV removed behind carve's back
	// within seconds (the shipped default is 1 minute).
	refreshInterval = 10 * time.Second
)

var auditArgs = []string{"--orphan-grace-period=" + orphanGrace.String(), "--audit-interval=" + auditInterval.String(),
	"--capacity-refresh-interval=" + refreshInterval.String()}

// The simulated nodes: three volume groups of different sizes, so that
// placement by capacity is visible. node-large removes orphans
// (--remove-orphans); the others only report them.
var nodeSpecs = withAudit(cluster.ThreeNodes())

// withAudit gives every node the test bed's audit flags, and node-large
// --remove-orphans.
func withAudit(nodes []cluster.NodeSpec) []cluster.NodeSpec {
	for i := range nodes {
		nodes[i].PluginArgs = auditArgs
		if nodes[i].Name == "node-large" {
			nodes[i].PluginArgs = append([]string{"--remove-orphans=true"}, auditArgs...)
		}
	}
	return nodes
}

func TestMain(m *testing.M) {
	klog.InitFlags(nil)
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	cfg, err := configFromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: e2e tier cannot run: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Lifetime)
	defer cancel()
	start := time.Now()
	bed, err = cluster.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: starting the e2e test bed: %v\n", err)
		return 1
	}
	fmt.Printf("e2e: test bed up in %s: etcd, kube-apiserver, kube-scheduler, kube-controller-manager (node lifecycle controller off), %d simulated nodes, each with its own carve plugin and csi-provisioner.\n",
		time.Since(start).Round(time.Millisecond), len(bed.Nodes))
	fmt.Printf("e2e: LVM on the host runs with activation DISABLED (lvm.conf global/activation=0 in each node's LVM_SYSTEM_DIR): LVs are metadata only, no /dev node appears. No kubelet runs: pods are scheduled and bound, containers never start.\n")
	fmt.Printf("e2e: run directory (logs, kubeconfig) %s\n", bed.Config.RunDir)

	code := m.Run()
	if code != 0 {
		bed.DumpLogs(30)
	}
	if err := bed.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: tearing the test bed down: %v\n", err)
		code = 1
	}
	left, err := bed.LeftOverLoopDevices(context.Background())
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "FAIL: listing loop devices after teardown: %v\n", err)
		code = 1
	case len(left) > 0:
		fmt.Fprintf(os.Stderr, "FAIL: loop devices left behind after teardown: %v\n", left)
		code = 1
	default:
		fmt.Println("e2e: teardown left no process, volume group or loop device behind")
	}
	if code == 0 {
		if err := os.RemoveAll(bed.Config.RunDir); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: removing the run directory: %v\n", err)
		}
	} else {
		fmt.Fprintf(os.Stderr, "e2e: logs kept in %s\n", filepath.Join(bed.Config.RunDir, "logs"))
	}
	return code
}

// configFromEnv reads where the binaries are: CARVE_E2E_BIN (the directory
// hack/e2e-tools.sh prints) and CARVE_BIN (bin/carve); make test-e2e sets
// both.
func configFromEnv() (cluster.Config, error) {
	binDir := os.Getenv("CARVE_E2E_BIN")
	carve := os.Getenv("CARVE_BIN")
	if binDir == "" || carve == "" {
		return cluster.Config{}, fmt.Errorf("CARVE_E2E_BIN (control-plane binaries, from hack/e2e-tools.sh) and CARVE_BIN (make build) must be set; run `make test-e2e` as root")
	}
	deploy, err := filepath.Abs(filepath.Join("..", "..", "deploy", "kubernetes"))
	if err != nil {
		return cluster.Config{}, err
	}
	component, err := filepath.Abs(filepath.Join("..", "..", "deploy", "kubernetes", "components", "delete-claims-of-lost-nodes", "rbac.yaml"))
	if err != nil {
		return cluster.Config{}, err
	}
	cfg := cluster.Config{
		// carve controller deletes the claims of deleted Nodes, with the
		// RBAC of the component that turns that on.
		ControllerArgs:        []string{"--delete-claims-of-lost-nodes=true", "--lost-nodes-interval=5s"},
		ExtraManifests:        []string{component},
		BinDir:                binDir,
		CarveBin:              carve,
		DeployDir:             deploy,
		SnapshotControllerDir: filepath.Join(deploy, "snapshot-controller"),
		Nodes:                 nodeSpecs,
		Lifetime:              25 * time.Minute,
	}
	return cfg, cluster.Requirements(cfg)
}
