//go:build nodes

// Package nodes is the real-node tier: the shipped kustomize base on a
// control plane whose node is a qemu guest with a real kubelet, containerd
// and device-mapper, running carve's own image. Pods really mount, write,
// grow and read their volumes (docs/development.md).
package nodes

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// bed is the test bed every scenario shares; TestMain starts and stops it.
var bed *cluster.Cluster

// nodeName is the one guest node: one guest is what a 2-core machine
// bears beside the control plane (each idle TCG guest takes ~0.3 cores).
const nodeName = "real-1"

// The guest's data disk holds the volume group "carve" that the shipped
// device classes name, with the thin pool "pool0": 12 GiB, of which the
// pool takes 3 GiB.
const dataDisk = 12 << 30

// absentClass is a device class whose volume group this node lacks
// (the test bed's one addition to the shipped device-class file).
const absentClass = "absent"

// postgresPort is the port the database tier's PostgreSQL listens on in
// the guest's own network (a hostNetwork pod), forwarded to the host.
const postgresPort = 5432

// postgresSecondPort is the second live database's port (the drain moves
// two), forwarded to the host like postgresPort.
const postgresSecondPort = 5433

// carveImage is the image the DaemonSet runs; the tests' pods run it too
// (it has a shell, coreutils and util-linux), so no other image is needed.
var carveImage string

func TestMain(m *testing.M) {
	os.Exit(kubetest.Tier{
		Name:   "nodes",
		Config: configFromEnv,
		Ready:  waitCarveRunning,
		Up: func(b *cluster.Cluster, took time.Duration) {
			others := "node lifecycle controller on"
			if len(b.Nodes) > 0 {
				others = fmt.Sprintf("node lifecycle controller off; %d simulated nodes", len(b.Nodes))
			}
			if len(b.GuestPeers) > 0 {
				others = fmt.Sprintf("node lifecycle controller off; %d simulated nodes; peer node agents in the guest: %s", len(b.Nodes), peerNames(b))
			}
			fmt.Printf("nodes: test bed up in %s: etcd, kube-apiserver, kube-scheduler, kube-controller-manager (%s); guest node %s (qemu TCG: kubelet, containerd, runc, CNI bridge, device-mapper LVM on a virtio disk) running the shipped DaemonSet and controller Deployment from carve's image.\n",
				took, others, nodeName)
		},
		DumpLines: 40,
	}.Main(m, &bed))
}

// configFromEnv reads CARVE_E2E_BIN (hack/e2e-tools.sh's directory),
// CARVE_BIN (bin/carve) and CARVE_IMAGES (the directory `make images`
// prints); make test-nodes sets them.
func configFromEnv() (cluster.Config, error) {
	binDir, carve, images := os.Getenv("CARVE_E2E_BIN"), os.Getenv("CARVE_BIN"), os.Getenv("CARVE_IMAGES")
	if binDir == "" || carve == "" || images == "" {
		return cluster.Config{}, fmt.Errorf("CARVE_E2E_BIN (hack/e2e-tools.sh), CARVE_BIN (make build) and CARVE_IMAGES (make images) must be set; run `make test-nodes` as root")
	}
	deploy, err := filepath.Abs(filepath.Join("..", "..", "deploy", "kubernetes"))
	if err != nil {
		return cluster.Config{}, err
	}
	archives, err := filepath.Glob(filepath.Join(images, "*.tar"))
	if err != nil {
		return cluster.Config{}, err
	}
	if len(archives) == 0 {
		return cluster.Config{}, fmt.Errorf("no image archives (*.tar) in CARVE_IMAGES=%s", images)
	}
	// The database tier (make test-databases) adds its PostgreSQL image
	// and makes the server's port reachable from the host, where its
	// client records every acknowledged transaction.
	var hostPorts []int
	lifetime := 40 * time.Minute
	if pg := os.Getenv("CARVE_POSTGRES_IMAGE"); pg != "" {
		archives = append(archives, pg)
		hostPorts = []int{postgresPort, postgresSecondPort}
		lifetime = time.Hour
	}
	m, err := cluster.LoadManifests(deploy)
	if err != nil {
		return cluster.Config{}, err
	}
	classes, err := m.DeviceClassFile()
	if err != nil {
		return cluster.Config{}, err
	}
	withAbsent, err := withAbsentClass(classes)
	if err != nil {
		return cluster.Config{}, err
	}
	if carveImage, err = m.CarveImage(); err != nil {
		return cluster.Config{}, err
	}
	simulated, err := simulatedNodes()
	if err != nil {
		return cluster.Config{}, err
	}
	peers := peersFromEnv()
	cfg := cluster.Config{
		BinDir:    binDir,
		CarveBin:  carve,
		DeployDir: deploy,
		// The snapshot CRDs, snapshot-controller as a process (as in the
		// e2e tier), and carve's VolumeSnapshotClass from the component
		// that adds it where the cluster serves snapshots (the base has
		// none).
		SnapshotControllerDir: filepath.Join(deploy, "snapshot-controller"),
		ExtraManifests:        []string{filepath.Join(deploy, "components", "snapshot-class", "snapshotclass.yaml")},
		GuestNodes: []cluster.GuestNodeSpec{{
			Name: nodeName, DataDiskSize: dataDisk, FirstBoot: cluster.ShippedClassesFirstBoot("3g"),
			HostPorts: hostPorts,
		}},
		Images:        archives,
		DeviceClasses: withAbsent,
		Lifetime:      lifetime,
		// Simulated nodes (make measure-placement-nodes) need the
		// controller on the guest, where it reaches every agent.
		Nodes:             simulated,
		ControllerOnGuest: len(simulated) > 0,
		// A second node agent with real device-mapper beside the guest's
		// (make test-nodes-peer): copies across nodes.
		GuestPeers: peers,
		// What the peer tier needs of carve controller.
		ControllerArgs: peerControllerArgs(peers),
	}
	return cfg, cluster.Requirements(cfg)
}

// withAbsentClass adds to the shipped device-class file a class whose
// volume group this node lacks. The file is decoded and encoded again,
// not appended to as text: the shipped file's layout is the chart's to
// choose.
func withAbsentClass(file string) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(file), &doc); err != nil {
		return "", fmt.Errorf("the shipped device-class file: %w", err)
	}
	classes, ok := doc["deviceClasses"].([]any)
	if !ok {
		return "", fmt.Errorf("the shipped device-class file has no deviceClasses list")
	}
	doc["deviceClasses"] = append(classes, map[string]any{"name": absentClass, "volumeGroup": "carve-absent"})
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// simulatedNodes are the simulated nodes CARVE_NODES_SIMULATED asks for
// beside the guest (make measure-placement-nodes; none by default): each
// with a volume group bigger than the guest's, so that the scheduler,
// left alone, would as soon place a pod there. Only TestMeasure* runs on
// such a bed: the other tests expect every pod on the guest.
func simulatedNodes() ([]cluster.NodeSpec, error) {
	v := os.Getenv("CARVE_NODES_SIMULATED")
	if v == "" {
		return nil, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 5 {
		return nil, fmt.Errorf("CARVE_NODES_SIMULATED=%q: want a number of simulated nodes from 1 to 5", v)
	}
	nodes := make([]cluster.NodeSpec, n)
	for i := range nodes {
		nodes[i] = cluster.NodeSpec{Name: fmt.Sprintf("sim-%d", i+1), VGSize: 2 * dataDisk}
	}
	return nodes, nil
}
