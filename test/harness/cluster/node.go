package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// Names fixed by DESIGN.md.
const (
	DriverName  = "lvm.carve.dev"
	TopologyKey = "topology.carve.dev/node"
)

// NodeSpec describes one simulated node.
type NodeSpec struct {
	Name string
	// VGSize is the size of the node's volume group's backing file.
	VGSize int64
	// PluginArgs are flags ("--name=value") the test bed sets on this
	// node's carve node beyond the DaemonSet's (a short grace period).
	PluginArgs []string
}

// Node is one simulated node: its API objects, its volume group and its
// carve node (the node agent), with what the kubelet would give it.
type Node struct {
	Name string
	// VG is the node's volume group (activation disabled).
	VG *lvmtest.LoopVG
	// LVM reads the node's volume group through carve's lvm package.
	LVM *lvm.Client
	// Socket is the carve node's unix socket.
	Socket string
	// MetricsURL is the carve node's Prometheus endpoint.
	MetricsURL string
	// PodName is the carve-node DaemonSet pod the controller manager made
	// for this node; the agent's token is bound to it.
	PodName string
	// ConfigFile is the device-class file the plugin reads.
	ConfigFile string
	// ChannelAddr is where the agent serves the node channel: the host's
	// IPv4 address and ChannelPort.
	ChannelAddr string
	ChannelPort int
	// CopyAddr, when the DaemonSet serves copies across nodes
	// (--node-copy-address), is where this agent serves them: the host's
	// address and a port of its own (every simulated node shares the IP).
	CopyAddr string
	// ChannelCAFile and ChannelTokenFile are what the kubelet would mount:
	// the CA bundle of ConfigMap carve-node-channel-ca and the agent's
	// projected token.
	ChannelCAFile, ChannelTokenFile string

	plugin *Process
	// pluginCmd starts the agent again (KillPlugin, StartPlugin).
	pluginCmd processCmd
}

// createNodeObjects creates the Node (Ready, with allocatable resources and
// the topology label that kubelet's plugin registration would add) and the
// CSINode object that registration would write.
func createNodeObjects(ctx context.Context, cs kubernetes.Interface, name string) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				"kubernetes.io/hostname": name,
				"kubernetes.io/os":       "linux",
				TopologyKey:              name,
			},
		},
	}
	created, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node %s: %w", name, err)
	}
	// The TaintNodesByCondition admission plugin taints a new node
	// not-ready; the node lifecycle controller (disabled here, as no
	// kubelet heartbeats) would lift it. Do its job once.
	// kube-controller-manager annotates new nodes (the TTL controller) at
	// the same time: on a conflict, read the node again and retry.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = nil
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("untaint Node %s: %w", name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	now := metav1.Now()
	status := corev1.NodeStatus{
		Capacity:    res,
		Allocatable: res,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated by carve's e2e harness (no kubelet runs)", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}},
		NodeInfo:  corev1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: "v1.36.1"},
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status = status
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("status of Node %s: %w", name, err)
	}
	csiNode := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: name, UID: created.UID,
			}},
		},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: DriverName, NodeID: name, TopologyKeys: []string{TopologyKey},
		}}},
	}
	if _, err := cs.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create CSINode %s: %w", name, err)
	}
	return nil
}

// waitDaemonSetPods waits until the DaemonSet has a pod bound to each node
// and returns their names by node.
func waitDaemonSetPods(ctx context.Context, cs kubernetes.Interface, ds *appsv1.DaemonSet, nodes []string, timeout time.Duration) (map[string]string, error) {
	sel := labels.SelectorFromSet(ds.Spec.Selector.MatchLabels).String()
	deadline := time.Now().Add(timeout)
	for {
		pods, err := cs.CoreV1().Pods(ds.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, err
		}
		byNode := map[string]string{}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				byNode[p.Spec.NodeName] = p.Name
			}
		}
		missing := []string{}
		for _, n := range nodes {
			if byNode[n] == "" {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			return byNode, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("DaemonSet %s/%s has no pod bound to node(s) %s after %s (kube-controller-manager makes them, kube-scheduler binds them)",
				ds.Namespace, ds.Name, strings.Join(missing, ", "), timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// nodeConfig is the device-class file of a node: the ConfigMap shipped in
// deploy/ with every class pointed at the node's own volume group. Thin
// classes are dropped, since a thin pool needs device-mapper, which the
// host kernel lacks (TESTBED.md); carve reports 0 bytes for them.
func nodeConfig(shipped *deviceclass.Config, vg string) *deviceclass.Config {
	out := &deviceclass.Config{}
	for _, c := range shipped.DeviceClasses {
		if c.Thin() {
			continue
		}
		c.VolumeGroup = vg
		out.DeviceClasses = append(out.DeviceClasses, c)
	}
	return out
}

// pluginFlags are the flags of the DaemonSet's carve container that the
// harness replaces: the node's own socket, state directory (beside the
// socket, on whatever the run directory is on), device-class file,
// metrics port, node-channel port and the files the kubelet would mount,
// and no kubelet registration (no kubelet runs on a simulated node;
// createNodeObjects writes what registration would). No kubeconfig: the
// node agent uses no Kubernetes API, as in the DaemonSet.
func (n *Node) pluginFlags(metricsPort int, extra []string) []FlagValue {
	flags := []FlagValue{
		{"endpoint", "unix://" + n.Socket},
		{"state-dir", filepath.Join(filepath.Dir(n.Socket), "state")},
		{"allow-volatile-state-dir", "true"},
		{"config", n.ConfigFile},
		{"metrics-address", fmt.Sprintf("127.0.0.1:%d", metricsPort)},
		{"kubelet-registration-dir", ""},
		{"node-channel-address", n.ChannelAddr},
		{"node-channel-ca-file", n.ChannelCAFile},
		{"node-channel-token-file", n.ChannelTokenFile},
		{"cgroup-root", n.cgroupRoot()},
	}
	if n.CopyAddr != "" {
		flags = append(flags, FlagValue{"node-copy-address", n.CopyAddr})
	}
	for _, a := range extra {
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		flags = append(flags, FlagValue{name, value})
	}
	return flags
}

// cgroupRoot is the simulated node's cgroup tree: a directory beside its
// socket whose cgroup.controllers names the io controller and that holds
// no pod, since no pod runs on a simulated node. IO limits a
// ControllerModifyVolume sets are then recorded on the LV and reach no
// pod; the real-node tier applies them to real pods' cgroups.
func (n *Node) cgroupRoot() string { return filepath.Join(filepath.Dir(n.Socket), "cgroup") }

func (n *Node) makeCgroupRoot() error {
	if err := os.MkdirAll(n.cgroupRoot(), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(n.cgroupRoot(), "cgroup.controllers"), []byte("cpu io memory pids\n"), 0o644)
}

// startPlugin starts `carve node` for the node with the program and args
// of the DaemonSet's carve container (carve-node, beside carveBin), with
// pluginFlags replaced (extra are the test bed's own, "--name=value"),
// with no API access (no kubeconfig, no token), and waits for its socket.
func (n *Node) startPlugin(ctx context.Context, ds *appsv1.DaemonSet, carveBin, logs string, extra []string, lifetime time.Duration) error {
	c, err := daemonSetContainer(ds, "carve node", isCarvePlugin)
	if err != nil {
		return err
	}
	port, err := FreePort()
	if err != nil {
		return err
	}
	n.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	host, _, err := net.SplitHostPort(n.ChannelAddr)
	if err != nil {
		return fmt.Errorf("node channel address %q: %w", n.ChannelAddr, err)
	}
	pod := PodFields{Namespace: ds.Namespace, Node: n.Name, Pod: n.PodName, IP: host}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	args, env, err := ContainerCommand(c, pod, n.pluginFlags(port, extra))
	if err != nil {
		return err
	}
	env = append(append(env, n.VG.Env()...), "LVM_SUPPRESS_FD_WARNINGS=1")
	bin, err := containerProgram(carveBin, c)
	if err != nil {
		return err
	}
	klog.InfoS("Starting carve with the DaemonSet's flags", "node", n.Name, "program", bin, "args", args)
	n.pluginCmd = processCmd{logs: logs, name: n.Name + "-carve", bin: bin, args: args, env: env, lifetime: lifetime}
	return n.StartPlugin(ctx)
}

// KillPlugin ends the node agent as a crash would (SIGKILL to the agent
// alone: an LVM command it started lives on, as it would in a container
// whose main process died while the command's process group did not) and
// reaps it.
func (n *Node) KillPlugin() error {
	if err := syscall.Kill(n.plugin.Pid(), syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill the node agent of %s: %w", n.Name, err)
	}
	n.plugin.Stop()
	return nil
}

// StartPlugin starts the node agent with the flags it was first started
// with and waits for its socket. ctx bounds the wait only: the process
// lives as long as the test bed.
func (n *Node) StartPlugin(ctx context.Context) error {
	var err error
	if n.plugin, err = n.pluginCmd.start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	return waitSocket(ctx, n.plugin, n.Socket, 60*time.Second)
}

func waitSocket(ctx context.Context, p *Process, sock string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if ended, err := p.Exited(); ended {
			return fmt.Errorf("%s exited (%w) before it listened on %s:\n%s", p.Name, err, sock, p.Tail(20))
		}
		if c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "unix", sock); err == nil {
			if err := c.Close(); err != nil {
				return fmt.Errorf("close the probe connection to %s: %w", sock, err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not listen on %s within %s:\n%s", p.Name, sock, timeout, p.Tail(20))
}

// envRef matches Kubernetes' $(VAR) references in container args.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// PodFields are the downward-API values of the pod a process stands in
// for.
type PodFields struct {
	Namespace, Node, Pod string
	// IP is status.podIP (a simulated node's agent listens on the host's
	// address).
	IP string
}

// FlagValue is one flag the harness sets on a process.
type FlagValue struct {
	Name, Value string
}

// ContainerCommand turns a container of the DaemonSet into the argv and
// environment of a process on this host: the args exactly as shipped, with
// $(VAR) expanded from the container's env (downward-API fields filled in
// as the kubelet would), except the flags in set, which the harness must
// choose for a process here (socket paths, loopback ports, a kubeconfig):
// their shipped values are dropped and set's are appended in order.
func ContainerCommand(c *corev1.Container, pod PodFields, set []FlagValue) (args, env []string, err error) {
	vars := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			vars[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "spec.nodeName":
				vars[e.Name] = pod.Node
			case "metadata.namespace":
				vars[e.Name] = pod.Namespace
			case "metadata.name":
				vars[e.Name] = pod.Pod
			case "status.podIP":
				vars[e.Name] = pod.IP
			default:
				return nil, nil, fmt.Errorf("container %s env %s: field %s is not simulated", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		default:
			return nil, nil, fmt.Errorf("container %s env %s: only values and field references are simulated", c.Name, e.Name)
		}
		env = append(env, e.Name+"="+vars[e.Name])
	}
	replaced := map[string]bool{}
	for _, f := range set {
		replaced[f.Name] = true
	}
	for i := 0; i < len(c.Args); i++ {
		a := envRef.ReplaceAllStringFunc(c.Args[i], func(ref string) string {
			if v, ok := vars[ref[2:len(ref)-1]]; ok {
				return v
			}
			return ref
		})
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "--") && replaced[name] {
			if !hasValue && i+1 < len(c.Args) && !strings.HasPrefix(c.Args[i+1], "-") {
				i++ // "--flag value": skip the value too
			}
			continue
		}
		args = append(args, a)
	}
	for _, f := range set {
		args = append(args, "--"+f.Name+"="+f.Value)
	}
	return args, env, nil
}

// findContainer returns the container of a workload's pod template that
// satisfies is; owner names the workload in the error.
func findContainer(spec *corev1.PodSpec, owner, what string, is func(*corev1.Container) bool) (*corev1.Container, error) {
	for i := range spec.Containers {
		if c := &spec.Containers[i]; is(c) {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%s has no %s container", owner, what)
}

// daemonSetContainer is findContainer for the node DaemonSet.
func daemonSetContainer(ds *appsv1.DaemonSet, what string, is func(*corev1.Container) bool) (*corev1.Container, error) {
	return findContainer(&ds.Spec.Template.Spec, "DaemonSet "+ds.Namespace+"/"+ds.Name, what, is)
}

// containerProgram is the make build binary that stands for the program a
// container of carve's image runs: carveBin (bin/carve, the image's
// entrypoint) when the container names no command, else the binary of the
// command's name beside carveBin (/usr/local/bin/carve-node is
// bin/carve-node).
func containerProgram(carveBin string, c *corev1.Container) (string, error) {
	cmd := c.Command
	if len(cmd) > 2 && path.Base(cmd[0]) == "tini" && cmd[1] == "--" {
		// The image's init (it reaps for PID 1): a process of the
		// test bed has a parent that does.
		cmd = cmd[2:]
	}
	c = &corev1.Container{Name: c.Name, Command: cmd}
	if len(c.Command) == 0 || path.Base(c.Command[0]) == filepath.Base(carveBin) {
		return carveBin, nil
	}
	bin := filepath.Join(filepath.Dir(carveBin), path.Base(c.Command[0]))
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("container %s runs %s, and %s is not beside the carve binary (make build builds both): %w", c.Name, c.Command[0], filepath.Base(bin), err)
	}
	return bin, nil
}

// runsCarveRole returns a test for the container that runs `carve <role>`.
func runsCarveRole(role string) func(*corev1.Container) bool {
	return func(c *corev1.Container) bool {
		return len(c.Args) > 0 && c.Args[0] == role || len(c.Command) > 0 && slices.Contains(c.Command, role)
	}
}

// isCarvePlugin tells the container that runs `carve node`.
var isCarvePlugin = runsCarveRole("node")

// serviceAccountKubeconfig writes a kubeconfig that authenticates as the
// service account sa (a token from the TokenRequest API valid for the
// test bed's lifetime), so a sidecar run as a process gets exactly the
// permissions carve's RBAC gives its pod.
func serviceAccountKubeconfig(ctx context.Context, cs kubernetes.Interface, cp *ControlPlane, namespace, sa, path string, lifetime time.Duration) error {
	if sa == "" {
		return errors.New("no serviceAccountName in the pod template")
	}
	expiry := int64((lifetime + time.Hour).Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for service account %s/%s: %w", namespace, sa, err)
	}
	return writeKubeconfig(path, cp.Server, cp.pki.CACert, "system:serviceaccount:"+namespace+":"+sa, tr.Status.Token)
}

// writeConfig writes the node's device-class file.
func (n *Node) writeConfig(cfg *deviceclass.Config) error {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(n.ConfigFile, data, 0o644)
}

// processes returns the node's running processes.
func (n *Node) processes() []*Process { return started(n.plugin) }

// FillVG creates an LV of size bytes directly with lvcreate, outside
// carve, as another tool on the node would.
func (n *Node) FillVG(ctx context.Context, name string, size uint64) error {
	_, err := n.VG.LVM(ctx, "lvcreate", "--yes", "--activate", "n", "--zero", "n",
		"--name", name, "--size", strconv.FormatUint(size, 10)+"b", n.VG.Name)
	return err
}

// RemoveLV removes an LV made by FillVG.
func (n *Node) RemoveLV(ctx context.Context, name string) error {
	_, err := n.VG.LVM(ctx, "lvremove", "--yes", n.VG.Name+"/"+name)
	return err
}

// Plugin is the node's carve node process.
func (n *Node) Plugin() *Process { return n.plugin }

// ThreeNodes are the simulated nodes of the e2e tier and of make
// bench-peers: volume groups of 2, 4 and 10 GiB, so that placement by
// capacity is visible.
func ThreeNodes() []NodeSpec {
	return []NodeSpec{
		{Name: "node-small", VGSize: 2 << 30},
		{Name: "node-medium", VGSize: 4 << 30},
		{Name: "node-large", VGSize: 10 << 30},
	}
}
