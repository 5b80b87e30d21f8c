package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/guestvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// Config describes a test bed.
type Config struct {
	// BinDir holds etcd, kube-apiserver, kube-scheduler,
	// kube-controller-manager, kubectl, csi-provisioner and csi-resizer
	// (hack/e2e-tools.sh).
	BinDir string
	// CarveBin is the carve binary (make build).
	CarveBin string
	// DeployDir is carve's deploy/kubernetes directory.
	DeployDir string
	// SnapshotControllerDir is deploy/kubernetes/snapshot-controller
	// (default: DeployDir/snapshot-controller when it exists):
	// its CRDs and objects are applied before carve's manifests, and
	// snapshot-controller (BinDir) runs as a process with its Deployment's
	// flags and service account.
	SnapshotControllerDir string
	// Nodes are the simulated nodes. When there are none, the node
	// lifecycle controller runs (every node has a kubelet) and the
	// controller Deployment runs on the guest nodes, not as processes.
	Nodes []NodeSpec
	// GuestNodes are real nodes (kubelet, containerd, device-mapper) in
	// qemu guests; they run the shipped DaemonSet from Images.
	GuestNodes []GuestNodeSpec
	// GuestPeers are peer nodes: more node agents, each with a volume
	// group of its own, in the first guest node (GuestPeerSpec), so that
	// copies across nodes run on real device-mapper. With peers the
	// controller Deployment runs on the first guest node, the DaemonSet
	// serves copies (--node-copy-address, added when the manifests leave
	// it off) and the node lifecycle controller is off, as with simulated
	// nodes. The scheduler may place any pod on a peer, where it never
	// runs: tests on such a bed pin their pods.
	GuestPeers []GuestPeerSpec
	// Images are the OCI archives the guest nodes import: carve's image,
	// the sidecars, the pause image and what the tests' pods run.
	Images []string
	// DeviceClasses, when set, replaces the device-class file of the
	// shipped ConfigMap (a test bed's disks differ from a real fleet's).
	DeviceClasses string
	// ControllerArgs are flags ("--name=value") the test bed sets on
	// carve controller beyond the Deployment's: on the processes it runs
	// for simulated nodes, else in the Deployment a guest node runs.
	ControllerArgs []string
	// ControllerOnGuest runs the controller Deployment on the first guest
	// node's kubelet even beside simulated nodes (make demo): a controller
	// run as host processes cannot reach a guest's pod network, while one
	// in the guest reaches the simulated nodes' agents at the host's
	// address. Central stays nil; ControllerArgs go into the Deployment.
	ControllerOnGuest bool
	// ExtraManifests are files of objects applied after deploy/ (a
	// component's RBAC, say).
	ExtraManifests []string
	// Lifetime bounds every process the cluster starts.
	Lifetime time.Duration
	// RunDir holds logs, keys, etcd data and loop files; a fresh temporary
	// directory when empty.
	RunDir string
	// VGPrefix starts every volume group name (one per node); it keeps
	// concurrent runs apart. Default "carve-e2e-<pid>".
	VGPrefix string
}

// Cluster is a running test bed.
type Cluster struct {
	Config    Config
	Control   *ControlPlane
	Client    kubernetes.Interface
	Manifests *Manifests
	Nodes     []*Node
	// Central is the controller Deployment (carve controller and its
	// sidecars), run as processes when there are simulated nodes.
	Central *Central
	// NodeChannel is how the simulated nodes' agents are published to
	// carve controller (nil without simulated nodes).
	NodeChannel *NodeChannel
	// DeviceClasses is the device-class file shipped in deploy/ (before the
	// harness points it at each node's volume group).
	DeviceClasses *deviceclass.Config
	// Namespace is carve's namespace from the manifests.
	Namespace string
	// GuestNodes are the running real nodes.
	GuestNodes []*GuestNode
	// GuestPeers are the running peer nodes (Config.GuestPeers).
	GuestPeers []*GuestPeer
	// SnapshotController runs when Config.SnapshotControllerDir is set.
	SnapshotController *SnapshotController

	kubeletProxy *kubeletProxy
	// stopMirror ends the simulated kubelets' copy of the CA bundle.
	stopMirror context.CancelFunc
	// extra are the processes started with StartProcess (a peer driver
	// beside carve); they stop first.
	extra []*Process
}

// Requirements returns an error naming everything the test bed needs and
// does not find: root, lvm2 and losetup, and the binaries.
func Requirements(cfg Config) error {
	var missing []string
	if err := lvmtest.Check(); err != nil {
		missing = append(missing, err.Error())
	}
	bins := []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "csi-provisioner", "csi-resizer"}
	if cfg.SnapshotControllerDir != "" {
		bins = append(bins, "snapshot-controller", "csi-snapshotter")
	}
	if len(cfg.GuestNodes) > 0 {
		bins = append(bins, "kubelet")
		for _, img := range cfg.Images {
			if _, err := os.Stat(img); err != nil {
				missing = append(missing, fmt.Sprintf("image archive %q (make images builds them)", img))
			}
		}
		for _, cmd := range []string{"qemu-system-x86_64", "socat", "containerd", "runc"} {
			if _, err := exec.LookPath(cmd); err != nil {
				missing = append(missing, cmd+" (hack/install-deps.sh installs it)")
			}
		}
	}
	for _, b := range bins {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			missing = append(missing, fmt.Sprintf("%s in %q (hack/e2e-tools.sh builds it; make test-e2e runs that)", b, cfg.BinDir))
		}
	}
	if _, err := os.Stat(cfg.CarveBin); err != nil {
		missing = append(missing, fmt.Sprintf("carve binary %q (make build)", cfg.CarveBin))
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		missing = append(missing, "losetup")
	}
	if len(missing) > 0 {
		return fmt.Errorf("the end-to-end test bed cannot start, missing: %s", strings.Join(missing, "; "))
	}
	return nil
}

// Start brings the whole test bed up: control plane, carve's manifests,
// nodes with their volume groups and node agents, the controller
// Deployment's processes, and the node channel between them. On error it
// tears down what it started.
func Start(ctx context.Context, cfg Config) (c *Cluster, err error) {
	// The base's VolumeSnapshotClass needs the snapshot CRDs: every test bed
	// (the tiers, make demo, make bench-peers) applies the kustomization
	// beside the base unless told otherwise.
	if cfg.SnapshotControllerDir == "" {
		if dir := filepath.Join(cfg.DeployDir, "snapshot-controller"); isDir(dir) {
			cfg.SnapshotControllerDir = dir
		}
	}
	if err := Requirements(cfg); err != nil {
		return nil, err
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = 30 * time.Minute
	}
	if cfg.VGPrefix == "" {
		cfg.VGPrefix = fmt.Sprintf("carve-e2e-%d", os.Getpid())
	}
	if cfg.RunDir == "" {
		if cfg.RunDir, err = os.MkdirTemp("", "carve-e2e-"); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"logs", "nodes"} {
		if err := os.MkdirAll(filepath.Join(cfg.RunDir, d), 0o755); err != nil {
			return nil, err
		}
	}
	c = &Cluster{Config: cfg}
	defer func() {
		if err != nil {
			c.DumpLogs(40)
			if serr := c.Stop(); serr != nil {
				err = errors.Join(err, fmt.Errorf("teardown: %w", serr))
			}
		}
	}()
	if c.Manifests, err = LoadManifests(cfg.DeployDir); err != nil {
		return c, err
	}
	ds, err := c.Manifests.NodeDaemonSet()
	if err != nil {
		return c, err
	}
	controller, err := c.Manifests.ControllerDeployment()
	if err != nil {
		return c, err
	}
	if len(cfg.Nodes) > 0 {
		// What the harness runs must be all there is, and all there before
		// anything starts.
		if err := checkNodeContainers(ds); err != nil {
			return c, err
		}
		if err := checkControllerContainers(controller); err != nil {
			return c, err
		}
		carveC, _ := findContainer(&controller.Spec.Template.Spec, "", "", isCarveController)
		if c.NodeChannel, err = nodeChannelOf(carveC, controller.Namespace, ds); err != nil {
			return c, err
		}
		if _, err := findContainer(&controller.Spec.Template.Spec, "", "", isSnapshotter); err == nil && cfg.SnapshotControllerDir == "" {
			return c, errors.New("the controller Deployment runs csi-snapshotter: the test bed needs Config.SnapshotControllerDir for the snapshot CRDs")
		}
	}
	if len(cfg.GuestPeers) > 0 {
		if err := c.preparePeers(ds, controller); err != nil {
			return c, err
		}
	}
	if cfg.ControllerOnGuest {
		if len(cfg.GuestNodes) == 0 {
			return c, errors.New("Config.ControllerOnGuest needs a guest node to run the controller Deployment on")
		}
		// Simulated nodes never run a pod: keep the scheduler off them.
		if err := c.Manifests.PinDeployment(controller.Namespace, controller.Name, cfg.GuestNodes[0].Name); err != nil {
			return c, err
		}
	}
	if len(cfg.Nodes) == 0 || cfg.ControllerOnGuest {
		// A guest's kubelet runs the controller Deployment: the flags go
		// into it.
		for _, a := range cfg.ControllerArgs {
			if err := c.Manifests.AddControllerArg(a); err != nil {
				return c, err
			}
		}
	}
	c.Namespace = ds.Namespace
	if c.DeviceClasses, err = c.shippedDeviceClasses(ds.Namespace); err != nil {
		return c, err
	}

	start := time.Now()
	opts := controlPlaneOptions{nodeLifecycle: len(cfg.Nodes) == 0 && len(cfg.GuestPeers) == 0}
	if len(cfg.GuestNodes) > 0 {
		opts.kubeletProxy = filepath.Join(cfg.RunDir, "kubelet-proxy.sock")
		if c.kubeletProxy, err = startKubeletProxy(opts.kubeletProxy); err != nil {
			return c, err
		}
	}
	if c.Control, err = startControlPlane(ctx, cfg.BinDir, cfg.RunDir, cfg.Lifetime, opts); err != nil {
		return c, fmt.Errorf("control plane: %w", err)
	}
	klog.InfoS("Control plane ready", "after", time.Since(start).Round(time.Millisecond))
	if c.Client, err = kubernetes.NewForConfig(c.Control.Config); err != nil {
		return c, err
	}
	if cfg.DeviceClasses != "" {
		if err := c.Manifests.SetDeviceClasses(ds.Namespace, cfg.DeviceClasses); err != nil {
			return c, err
		}
	}
	logs := filepath.Join(cfg.RunDir, "logs")
	if cfg.SnapshotControllerDir != "" {
		if c.SnapshotController, err = startSnapshotController(ctx, c.Client, c.Control, cfg.SnapshotControllerDir, filepath.Join(cfg.BinDir, "snapshot-controller"), cfg.RunDir, logs, cfg.Lifetime); err != nil {
			return c, fmt.Errorf("snapshot-controller: %w", err)
		}
	}
	if err := c.Manifests.Apply(ctx, c.Control.Config); err != nil {
		return c, fmt.Errorf("apply deploy/ manifests: %w", err)
	}
	for _, f := range cfg.ExtraManifests {
		data, err := os.ReadFile(f)
		if err != nil {
			return c, err
		}
		extra, err := ParseManifests(data, f)
		if err != nil {
			return c, err
		}
		if err := extra.Apply(ctx, c.Control.Config); err != nil {
			return c, fmt.Errorf("apply %s: %w", f, err)
		}
	}

	names := make([]string, len(cfg.Nodes))
	for i, spec := range cfg.Nodes {
		names[i] = spec.Name
		if err := createNodeObjects(ctx, c.Client, spec.Name); err != nil {
			return c, err
		}
	}
	pods, err := waitDaemonSetPods(ctx, c.Client, ds, names, 2*time.Minute)
	if err != nil {
		return c, err
	}
	for _, spec := range cfg.Nodes {
		if err := c.startNode(ctx, ds, spec, pods[spec.Name]); err != nil {
			return c, err
		}
	}
	if len(cfg.Nodes) > 0 && !cfg.ControllerOnGuest {
		if err := c.startCentral(ctx, controller); err != nil {
			return c, fmt.Errorf("controller Deployment: %w", err)
		}
	}
	if err := c.startGuestNodes(ctx); err != nil {
		return c, err
	}
	if len(cfg.Nodes) > 0 && cfg.ControllerOnGuest {
		if err := c.enrollFromGuest(ctx); err != nil {
			return c, fmt.Errorf("controller Deployment on %s: %w", cfg.GuestNodes[0].Name, err)
		}
	}
	if err := c.startGuestPeers(ctx, ds); err != nil {
		return c, fmt.Errorf("peer nodes in %s: %w", cfg.GuestNodes[0].Name, err)
	}
	klog.InfoS("Test bed up", "nodes", len(c.Nodes), "guestNodes", len(c.GuestNodes), "guestPeers", len(c.GuestPeers), "after", time.Since(start).Round(time.Millisecond), "runDir", cfg.RunDir)
	return c, nil
}

// checkNodeContainers returns an error unless the node DaemonSet runs
// `carve node` alone (the node agent): a container the harness does not
// know would silently not run.
func checkNodeContainers(ds *appsv1.DaemonSet) error {
	var errs []error
	for i := range ds.Spec.Template.Spec.Containers {
		if ct := &ds.Spec.Template.Spec.Containers[i]; !isCarvePlugin(ct) {
			errs = append(errs, fmt.Errorf("the node DaemonSet %s/%s runs container %s (%s) beside carve node, which the test bed does not run", ds.Namespace, ds.Name, ct.Name, ct.Image))
		}
	}
	return errors.Join(errs...)
}

// startNode gives a simulated node its volume group, device-class file and
// node-channel files (its token bound to pod, the node's DaemonSet pod)
// and starts its carve node.
func (c *Cluster) startNode(ctx context.Context, ds *appsv1.DaemonSet, spec NodeSpec, pod string) error {
	cfg := c.Config
	dir := filepath.Join(cfg.RunDir, "nodes", spec.Name)
	if err := os.MkdirAll(filepath.Join(dir, "node-channel"), 0o755); err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	n := &Node{
		Name:             spec.Name,
		Socket:           filepath.Join(dir, "csi.sock"),
		ConfigFile:       filepath.Join(dir, "device-classes.yaml"),
		PodName:          pod,
		ChannelPort:      port,
		ChannelAddr:      net.JoinHostPort(c.NodeChannel.IP, strconv.Itoa(port)),
		ChannelCAFile:    filepath.Join(dir, "node-channel", "ca.crt"),
		ChannelTokenFile: filepath.Join(dir, "token"),
	}
	if servesCopies(ds) {
		cp, err := FreePort()
		if err != nil {
			return err
		}
		n.CopyAddr = net.JoinHostPort(c.NodeChannel.IP, strconv.Itoa(cp))
	}
	c.Nodes = append(c.Nodes, n)
	if n.VG, err = lvmtest.NewLoopVG(ctx, dir, cfg.VGPrefix+"-"+spec.Name, spec.VGSize, false); err != nil {
		return fmt.Errorf("volume group of node %s: %w", spec.Name, err)
	}
	n.LVM = lvm.New(lvm.Options{Env: append(n.VG.Env(), "LVM_SUPPRESS_FD_WARNINGS=1")})
	if err := n.writeConfig(nodeConfig(c.DeviceClasses, n.VG.Name)); err != nil {
		return err
	}
	if err := c.NodeChannel.writeToken(ctx, c.Client, n, cfg.Lifetime); err != nil {
		return err
	}
	if err := n.startPlugin(ctx, ds, cfg.CarveBin, filepath.Join(cfg.RunDir, "logs"), spec.PluginArgs, cfg.Lifetime); err != nil {
		return fmt.Errorf("carve node of node %s: %w", spec.Name, err)
	}
	return nil
}

// startCentral runs the controller Deployment as processes and does the
// kubelet's and the EndpointSlice controller's part for every simulated
// node: once carve controller has published its CA, each node gets the CA
// file and an EndpointSlice. It returns when the controller has enrolled
// every node (it wrote their CSIStorageCapacity objects).
func (c *Cluster) startCentral(ctx context.Context, d *appsv1.Deployment) error {
	cfg := c.Config
	dir := filepath.Join(cfg.RunDir, "controller")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logs := filepath.Join(cfg.RunDir, "logs")
	var err error
	if c.Central, err = startCentral(ctx, c.Client, c.Control, d, cfg.CarveBin, dir, logs, cfg.ControllerArgs, cfg.Lifetime); err != nil {
		return err
	}
	ca, err := c.NodeChannel.waitCABundle(ctx, c.Client, c.Central, time.Minute)
	if err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := os.WriteFile(n.ChannelCAFile, ca, 0o644); err != nil {
			return err
		}
		if err := c.NodeChannel.PublishEndpoint(ctx, c.Client, n, n.Name); err != nil {
			return err
		}
	}
	c.startCAMirror(ca)
	if err := c.Central.startSidecars(ctx, c.Client, c.Control, d, cfg.BinDir, dir, logs, cfg.Lifetime); err != nil {
		return err
	}
	// Its pods must be bound to simulated nodes before a guest node joins,
	// or a kubelet would run a second controller.
	replicas := 1
	if d.Spec.Replicas != nil {
		replicas = int(*d.Spec.Replicas)
	}
	if err := waitPodsBound(ctx, c.Client, d.Namespace, d.Spec.Selector.MatchLabels, replicas, time.Minute); err != nil {
		return err
	}
	scs, err := c.StorageClasses()
	if err != nil {
		return err
	}
	var nodes, classes []string
	for _, n := range c.Nodes {
		nodes = append(nodes, n.Name)
	}
	for _, sc := range scs {
		classes = append(classes, sc.Name)
	}
	return c.NodeChannel.waitCapacity(ctx, c.Client, c.Central, nodes, classes, 2*time.Minute)
}

// enrollFromGuest does, for a controller Deployment that runs on a guest
// node, the kubelet's and the EndpointSlice controller's part for every
// simulated node (as startCentral does for one run as processes): once
// the controller has published its CA, each node gets the CA file and an
// EndpointSlice at the guest's forward of its agent's listener. It returns when the controller has
// enrolled every simulated node. The waits allow for pods started under
// qemu's emulation.
func (c *Cluster) enrollFromGuest(ctx context.Context) error {
	ca, err := c.NodeChannel.waitCABundle(ctx, c.Client, nil, 10*time.Minute)
	if err != nil {
		return err
	}
	var nodes, classes []string
	for _, n := range c.Nodes {
		if err := os.WriteFile(n.ChannelCAFile, ca, 0o644); err != nil {
			return err
		}
		if err := c.NodeChannel.publishEndpointAt(ctx, c.Client, n, n.Name, guestvm.GuestForwardIP); err != nil {
			return err
		}
		nodes = append(nodes, n.Name)
	}
	c.startCAMirror(ca)
	scs, err := c.StorageClasses()
	if err != nil {
		return err
	}
	for _, sc := range scs {
		classes = append(classes, sc.Name)
	}
	return c.NodeChannel.waitCapacity(ctx, c.Client, nil, nodes, classes, 5*time.Minute)
}

// shippedDeviceClasses reads the device-class file from the ConfigMap that
// the DaemonSet mounts at the plugin's --config path.
func (c *Cluster) shippedDeviceClasses(namespace string) (*deviceclass.Config, error) {
	for _, o := range c.Manifests.Find("ConfigMap") {
		cm := &corev1.ConfigMap{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, cm); err != nil {
			return nil, err
		}
		data, ok := cm.Data["config.yaml"]
		if !ok || cm.Namespace != namespace {
			continue
		}
		cfg := &deviceclass.Config{}
		if err := yaml.UnmarshalStrict([]byte(data), cfg); err != nil {
			return nil, fmt.Errorf("ConfigMap %s/%s config.yaml: %w", cm.Namespace, cm.Name, err)
		}
		return cfg, nil
	}
	return nil, errors.New("no ConfigMap with a config.yaml (the device-class file) in the manifests")
}

// Node returns the node of that name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// processes returns every process the cluster started beside the control
// plane: the extra ones, snapshot-controller, the controller Deployment's,
// then each node's.
func (c *Cluster) processes() []*Process {
	ps := started(c.extra...)
	ps = append(ps, c.SnapshotController.processes()...)
	if c.Central != nil {
		ps = append(ps, c.Central.processes()...)
	}
	for _, n := range c.Nodes {
		ps = append(ps, n.processes()...)
	}
	return ps
}

// StartProcess starts one more program beside the test bed (a peer driver
// run for comparison), logging into the run directory's logs/name.log,
// bounded by the test bed's lifetime and stopped (by its own pid) before
// the rest of the test bed.
func (c *Cluster) StartProcess(ctx context.Context, name, bin string, args, env []string) (*Process, error) {
	p, err := startProcess(ctx, filepath.Join(c.Config.RunDir, "logs"), name, bin, args, env, c.Config.Lifetime)
	if err != nil {
		return nil, err
	}
	c.extra = append(c.extra, p)
	return p, nil
}

// StopProcess stops a program started with StartProcess before the test
// bed ends (a test that restarts it), so that CheckAlive no longer
// counts it.
func (c *Cluster) StopProcess(p *Process) {
	p.Stop()
	c.extra = slices.DeleteFunc(c.extra, func(q *Process) bool { return q == p })
}

// ServiceAccountKubeconfig writes to path a kubeconfig that authenticates
// as the service account namespace/sa, so a process started beside the
// test bed gets exactly what its RBAC grants.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, sa, path string) error {
	return serviceAccountKubeconfig(ctx, c.Client, c.Control, namespace, sa, path, c.Config.Lifetime)
}

// CheckAlive returns an error naming every started process that has ended.
func (c *Cluster) CheckAlive() error {
	var errs []error
	if c.Control != nil {
		if err := c.Control.checkAlive(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range c.processes() {
		if ended, err := p.Exited(); ended {
			errs = append(errs, fmt.Errorf("%s ended (%w):\n%s", p.Name, err, p.Tail(20)))
		}
	}
	return errors.Join(errs...)
}

// DumpLogs prints the tail of every process's log to stderr.
func (c *Cluster) DumpLogs(lines int) {
	if c.Control != nil {
		c.Control.dumpLogs(lines)
	}
	for _, p := range c.processes() {
		fmt.Fprintf(os.Stderr, "----- last %d lines of %s (%s)\n%s\n", lines, p.Name, p.LogPath, p.Tail(lines))
	}
	for _, g := range c.GuestNodes {
		// A boot that failed before this one (bootNew) left its logs too.
		for _, l := range []string{"boot-failed-boot", "kubelet-failed-boot", "boot", "kubelet"} {
			if _, err := os.Stat(g.LogPath(l)); err != nil && strings.HasSuffix(l, "-failed-boot") {
				continue
			}
			fmt.Fprintf(os.Stderr, "----- last %d lines of guest node %s's %s log (%s)\n%s\n", lines, g.Spec.Name, l, g.LogPath(l), tailFile(g.LogPath(l), lines))
		}
	}
	fmt.Fprint(os.Stderr, c.peerLogs(lines))
}

// startCAMirror keeps the simulated nodes' CA files current with the
// controller's ConfigMap, which now holds ca, until Stop.
func (c *Cluster) startCAMirror(ca []byte) {
	files := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		files[i] = n.ChannelCAFile
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stopMirror = cancel
	go c.NodeChannel.mirrorCABundle(ctx, c.Client, files, ca)
}

// Stop stops every process (by its own pid) and removes the volume groups,
// loop devices and etcd's data. Logs stay in the run directory.
func (c *Cluster) Stop() error {
	if c.stopMirror != nil {
		c.stopMirror()
	}
	var errs []error
	if err := c.stopGuestNodes(); err != nil {
		errs = append(errs, err)
	}
	for _, p := range c.processes() {
		p.Stop()
	}
	if c.Control != nil {
		c.Control.Stop()
		// etcd preallocates tens of MB of WAL; the logs are what is worth
		// keeping.
		if err := os.RemoveAll(filepath.Join(c.Config.RunDir, "etcd")); err != nil {
			errs = append(errs, err)
		}
	}
	for _, n := range c.Nodes {
		if n.VG != nil {
			if err := n.VG.Close(); err != nil {
				errs = append(errs, fmt.Errorf("volume group of node %s: %w", n.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// LeftOverLoopDevices lists the loop devices still attached to the nodes'
// backing files (there should be none after Stop).
func (c *Cluster) LeftOverLoopDevices(ctx context.Context) ([]string, error) {
	var left []string
	for _, n := range c.Nodes {
		if n.VG == nil {
			continue
		}
		for _, f := range n.VG.Files {
			if _, err := os.Stat(f); err != nil {
				continue // removed with its device
			}
			devs, err := loopDevicesOf(ctx, f)
			if err != nil {
				return nil, err
			}
			left = append(left, devs...)
		}
	}
	return left, nil
}

// loopDevicesOf lists the loop devices attached to file.
func loopDevicesOf(ctx context.Context, file string) ([]string, error) {
	out, err := runCommand(ctx, time.Minute, nil, "losetup", "--list", "--noheadings", "--output", "NAME", "--associated", file)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// StorageClasses returns the WaitForFirstConsumer StorageClasses of carve's
// driver among the manifests.
func (c *Cluster) StorageClasses() ([]*storagev1.StorageClass, error) {
	var out []*storagev1.StorageClass
	for _, o := range c.Manifests.Find("StorageClass") {
		sc := &storagev1.StorageClass{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, sc); err != nil {
			return nil, err
		}
		if sc.Provisioner == DriverName && sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer {
			out = append(out, sc)
		}
	}
	return out, nil
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// servesCopies says whether the DaemonSet's node agents serve copies
// across nodes (a --node-copy-address flag: the chart's node.nodeCopyPort).
func servesCopies(ds *appsv1.DaemonSet) bool {
	for _, c := range ds.Spec.Template.Spec.Containers {
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--node-copy-address") {
				return true
			}
		}
	}
	return false
}
