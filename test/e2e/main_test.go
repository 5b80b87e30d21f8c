//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// bed is the test bed every scenario shares; TestMain starts and stops it.
var bed *cluster.Cluster

// finale is what runs after every other scenario, in this order:
// TestNodeLostForGood takes a Node away for the rest of the run, and
// TestNothingLeftBehind checks what all the others left.
var finale = kubetest.NewFinale("TestNodeLostForGood", "TestNothingLeftBehind")

// The test bed's audit: short grace periods so that orphans show, and with
// --remove-orphans are quarantined and removed, within seconds (the
// shipped defaults are 6 hours and 7 days).
const (
	orphanGrace        = 12 * time.Second
	orphanRemovalGrace = 10 * time.Second
	auditInterval      = 2 * time.Second
	// lostNodeGrace is how long a deleted Node stays absent before carve
	// controller deletes its claims (the shipped default is 30 minutes):
	// long enough for TestNodeReRegistered to bring its Node back.
	lostNodeGrace = 20 * time.Second
	// refreshInterval lets the view see an LV removed behind carve's back
	// within seconds (the shipped default is 1 minute).
	refreshInterval = 10 * time.Second
)

// auditArgs are carve controller's audit flags in the test bed. It only
// reports orphans; TestOrphanedVolume restarts it with --remove-orphans
// for its removal.
var auditArgs = []string{"--orphan-grace-period=" + orphanGrace.String(), "--audit-interval=" + auditInterval.String(),
	"--orphan-removal-grace-period=" + orphanRemovalGrace.String()}

// The simulated nodes: three volume groups of different sizes, so that
// placement by capacity is visible.
var nodeSpecs = withRefresh(cluster.ThreeNodes())

// withRefresh gives every node the test bed's refresh interval.
func withRefresh(nodes []cluster.NodeSpec) []cluster.NodeSpec {
	for i := range nodes {
		nodes[i].PluginArgs = []string{"--capacity-refresh-interval=" + refreshInterval.String()}
	}
	return nodes
}

func TestMain(m *testing.M) {
	os.Exit(kubetest.Tier{
		Name:   "e2e",
		Config: configFromEnv,
		Up: func(bed *cluster.Cluster, took time.Duration) {
			fmt.Printf("e2e: test bed up in %s: etcd, kube-apiserver, kube-scheduler, kube-controller-manager (node lifecycle controller off), %d simulated nodes, each with its own carve node (the node agent, its node channel on %s), and the controller Deployment's processes (carve controller, %s) enrolling them over the node channel.\n",
				took, len(bed.Nodes), bed.NodeChannel.IP, sidecarNames(bed))
			fmt.Printf("e2e: LVM on the host runs with activation DISABLED (lvm.conf global/activation=0 in each node's LVM_SYSTEM_DIR): LVs are metadata only, no /dev node appears. No kubelet runs: pods are scheduled and bound, containers never start.\n")
		},
		DumpLines: 30,
		AfterStop: noLoopDevicesLeft,
		Finale:    finale,
	}.Main(m, &bed))
}

// sidecarNames lists the controller Deployment's sidecars the test bed runs.
func sidecarNames(bed *cluster.Cluster) string {
	names := []string{"csi-provisioner"}
	if bed.Central.Snapshotter() != nil {
		names = append(names, "csi-snapshotter")
	}
	return strings.Join(append(names, "csi-resizer"), ", ")
}

// noLoopDevicesLeft checks that the teardown detached every loop device
// the simulated nodes' volume groups sat on.
func noLoopDevicesLeft(bed *cluster.Cluster) error {
	left, err := bed.LeftOverLoopDevices(context.Background())
	if err != nil {
		return fmt.Errorf("listing loop devices after teardown: %w", err)
	}
	if len(left) > 0 {
		return fmt.Errorf("loop devices left behind after teardown: %v", left)
	}
	fmt.Println("e2e: teardown left no process, volume group or loop device behind")
	return nil
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
		// RBAC of the component that turns that on, and audits the nodes
		// every few seconds.
		ControllerArgs: append([]string{"--delete-claims-of-lost-nodes=true", "--lost-nodes-interval=5s",
			"--lost-node-grace-period=" + lostNodeGrace.String()}, auditArgs...),
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
