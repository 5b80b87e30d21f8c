//go:build peers

package peers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// TopoLVM's names, as its chart renders them.
const (
	topolvmDriver      = "topolvm.io"
	topolvmTopologyKey = "topology.topolvm.io/node"
	topolvmNamespace   = "topolvm-system"
	topolvmSC          = "topolvm-provisioner"
	// topolvmDeviceClass is the one device class each node's lvmd serves.
	topolvmDeviceClass = "ssd"
	// topolvmCapacityAnnotation is where topolvm-node publishes a node's
	// free bytes per device class; its controller's GetCapacity reads it.
	topolvmCapacityAnnotation = "capacity.topolvm.io/" + topolvmDeviceClass
)

// topolvm is TopoLVM running beside carve on the same test bed: its chart
// applied (CRD, RBAC, CSIDriver, StorageClass, and the Deployment and
// DaemonSet whose Pod objects own what its processes publish), its
// controller and the controller's csi-provisioner as processes, and one
// topolvm-node (lvmd embedded) per simulated node on its own loop-device
// volume group of the same size as carve's.
type topolvm struct {
	nodes map[string]*topolvmNode
	// ProvisionerMetricsURL is the central csi-provisioner's metrics.
	ProvisionerMetricsURL string
	controller            *cluster.Process
	provisioner           *cluster.Process
}

// topolvmNode is topolvm-node on one simulated node.
type topolvmNode struct {
	VG      *lvmtest.LoopVG
	Process *cluster.Process
	// LVMLog has one line per LVM command topolvm-node ran (lvmcount).
	LVMLog string
}

// startTopoLVM starts TopoLVM from dir (hack/topolvm.sh: hypertopolvm and
// the rendered chart) on bed's nodes.
func startTopoLVM(ctx context.Context, bed *cluster.Cluster, dir string) (_ *topolvm, err error) {
	tv := &topolvm{nodes: map[string]*topolvmNode{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, tv.closeVGs())
		}
	}()
	bin := filepath.Join(dir, "hypertopolvm")
	lvmBin, err := exec.LookPath("lvm")
	if err != nil {
		return tv, fmt.Errorf("TopoLVM runs lvm subcommands through its command prefix: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "topolvm.yaml"))
	if err != nil {
		return tv, fmt.Errorf("TopoLVM's rendered chart (hack/topolvm.sh): %w", err)
	}
	m, err := cluster.ParseManifests(data, "topolvm.yaml")
	if err != nil {
		return tv, err
	}
	cs := bed.Client
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: topolvmNamespace}}, metav1.CreateOptions{}); err != nil {
		return tv, fmt.Errorf("namespace %s: %w", topolvmNamespace, err)
	}
	if err := m.Apply(ctx, bed.Control.Config); err != nil {
		return tv, fmt.Errorf("TopoLVM's chart: %w", err)
	}
	deploy, ds := &appsv1.Deployment{}, &appsv1.DaemonSet{}
	for _, o := range []struct {
		kind, name string
		into       any
	}{{"Deployment", "topolvm-controller", deploy}, {"DaemonSet", "topolvm-node", ds}} {
		found := false
		for _, u := range m.Find(o.kind) {
			if u.GetName() == o.name {
				found = true
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, o.into); err != nil {
					return tv, err
				}
			}
		}
		if !found {
			return tv, fmt.Errorf("TopoLVM's chart has no %s %s", o.kind, o.name)
		}
	}
	spare, err := carveSpareGiB(bed)
	if err != nil {
		return tv, err
	}
	logs := filepath.Join(bed.Config.RunDir, "topolvm")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return tv, err
	}
	// lvmcount notes each LVM command topolvm-node runs (TestPeersIdle
	// counts them); a small static program, about a millisecond a command.
	lvmcount := filepath.Join(logs, "lvmcount")
	goCmd := os.Getenv("GO")
	if goCmd == "" {
		goCmd = "go"
	}
	// Built from this file's directory, wherever the test binary runs.
	_, self, _, _ := goruntime.Caller(0)
	if out, err := exec.CommandContext(ctx, goCmd, "-C", filepath.Dir(self), "build", "-o", lvmcount, "./lvmcount").CombinedOutput(); err != nil {
		return tv, fmt.Errorf("building test/peers/lvmcount: %w: %s", err, out)
	}

	// What node-driver-registrar and the kubelet would do on each node:
	// the topology label on the Node and the driver in its CSINode.
	for _, n := range bed.Nodes {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, topolvmTopologyKey, n.Name)
		if _, err := cs.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return tv, fmt.Errorf("label Node %s: %w", n.Name, err)
		}
		csiNode, err := cs.StorageV1().CSINodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return tv, err
		}
		csiNode.Spec.Drivers = append(csiNode.Spec.Drivers, storagev1.CSINodeDriver{Name: topolvmDriver, NodeID: n.Name, TopologyKeys: []string{topolvmTopologyKey}})
		if _, err := cs.StorageV1().CSINodes().Update(ctx, csiNode, metav1.UpdateOptions{}); err != nil {
			return tv, fmt.Errorf("CSINode %s: %w", n.Name, err)
		}
	}

	// topolvm-node first: the controller's first GetCapacity reads the
	// annotations it writes.
	nodeKC := filepath.Join(logs, "node.kubeconfig")
	if err := bed.ServiceAccountKubeconfig(ctx, topolvmNamespace, ds.Spec.Template.Spec.ServiceAccountName, nodeKC); err != nil {
		return tv, err
	}
	nodeC, err := command(&ds.Spec.Template.Spec, "topolvm-node")
	if err != nil {
		return tv, err
	}
	for _, spec := range bed.Config.Nodes {
		n := bed.Node(spec.Name)
		dir := filepath.Join(logs, n.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return tv, err
		}
		tn := &topolvmNode{}
		tv.nodes[n.Name] = tn
		if tn.VG, err = lvmtest.NewLoopVG(ctx, dir, bed.Config.VGPrefix+"-tv-"+n.Name, spec.VGSize, false); err != nil {
			return tv, fmt.Errorf("TopoLVM's volume group on %s: %w", n.Name, err)
		}
		// lvm-command-prefix holds the lvm binary itself: TopoLVM runs
		// `lvm fullreport` and `lvm lvcreate` through it, here through
		// lvmcount.
		tn.LVMLog = filepath.Join(dir, "lvm-commands.log")
		lvmd, err := yaml.Marshal(map[string]any{
			"device-classes": []map[string]any{{
				"name": topolvmDeviceClass, "volume-group": tn.VG.Name, "default": true, "spare-gb": spare,
			}},
			"lvm-command-prefix": []string{lvmcount, tn.LVMLog, lvmBin},
		})
		if err != nil {
			return tv, err
		}
		lvmdConf := filepath.Join(dir, "lvmd.yaml")
		if err := os.WriteFile(lvmdConf, lvmd, 0o644); err != nil {
			return tv, err
		}
		port, err := cluster.FreePort()
		if err != nil {
			return tv, err
		}
		args, env, err := cluster.ContainerCommand(nodeC, cluster.PodFields{Namespace: topolvmNamespace, Node: n.Name}, []cluster.FlagValue{
			{Name: "csi-socket", Value: filepath.Join(dir, "csi-topolvm.sock")},
			{Name: "config", Value: lvmdConf},
			{Name: "metrics-bind-address", Value: fmt.Sprintf("127.0.0.1:%d", port)},
		})
		if err != nil {
			return tv, err
		}
		// TopoLVM's commands take no --kubeconfig flag.
		env = append(append(env, "KUBECONFIG="+nodeKC, "LVM_SUPPRESS_FD_WARNINGS=1"), tn.VG.Env()...)
		klog.InfoS("Starting topolvm-node with its chart's flags", "node", n.Name, "args", args)
		if tn.Process, err = bed.StartProcess(ctx, n.Name+"-topolvm-node", bin, args, env); err != nil {
			return tv, err
		}
	}
	if err := waitFor(ctx, 2*time.Minute, "topolvm-node to annotate every Node with its capacity", func(ctx context.Context) (bool, string, error) {
		var missing []string
		for _, n := range bed.Nodes {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			if node.Annotations[topolvmCapacityAnnotation] == "" {
				missing = append(missing, n.Name)
			}
		}
		return len(missing) == 0, "missing on " + strings.Join(missing, ", "), tv.checkAlive()
	}); err != nil {
		return tv, err
	}

	pod, err := boundPod(ctx, bed, deploy.Namespace, deploy.Spec.Selector.MatchLabels)
	if err != nil {
		return tv, fmt.Errorf("the topolvm-controller Deployment's pod: %w", err)
	}
	ctrlKC := filepath.Join(logs, "controller.kubeconfig")
	if err := bed.ServiceAccountKubeconfig(ctx, topolvmNamespace, deploy.Spec.Template.Spec.ServiceAccountName, ctrlKC); err != nil {
		return tv, err
	}
	socket := filepath.Join(logs, "csi-topolvm.sock")
	fields := cluster.PodFields{Namespace: topolvmNamespace, Pod: pod}
	ctrlC, err := command(&deploy.Spec.Template.Spec, "topolvm-controller")
	if err != nil {
		return tv, err
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = cluster.FreePort(); err != nil {
			return tv, err
		}
	}
	args, env, err := cluster.ContainerCommand(ctrlC, fields, []cluster.FlagValue{
		{Name: "csi-socket", Value: socket},
		{Name: "leader-election", Value: "false"},
		{Name: "metrics-bind-address", Value: fmt.Sprintf("127.0.0.1:%d", ports[0])},
		{Name: "health-probe-bind-address", Value: fmt.Sprintf("127.0.0.1:%d", ports[1])},
	})
	if err != nil {
		return tv, err
	}
	klog.InfoS("Starting topolvm-controller with its chart's flags", "args", args)
	if tv.controller, err = bed.StartProcess(ctx, "topolvm-controller", bin, args, append(env, "KUBECONFIG="+ctrlKC)); err != nil {
		return tv, err
	}
	if err := waitFor(ctx, time.Minute, "topolvm-controller to listen on "+socket, func(context.Context) (bool, string, error) {
		_, err := os.Stat(socket)
		return err == nil, fmt.Sprint(err), tv.checkAlive()
	}); err != nil {
		return tv, err
	}
	provC, err := command(&deploy.Spec.Template.Spec, "csi-provisioner")
	if err != nil {
		return tv, err
	}
	tv.ProvisionerMetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[2])
	args, env, err = cluster.ContainerCommand(provC, fields, []cluster.FlagValue{
		{Name: "csi-address", Value: socket},
		{Name: "leader-election", Value: "false"},
		{Name: "http-endpoint", Value: fmt.Sprintf("127.0.0.1:%d", ports[2])},
		{Name: "kubeconfig", Value: ctrlKC},
	})
	if err != nil {
		return tv, err
	}
	// args[0] is the sidecar's own name (the image's entry point).
	klog.InfoS("Starting TopoLVM's csi-provisioner with its chart's flags", "args", args[1:])
	if tv.provisioner, err = bed.StartProcess(ctx, "topolvm-csi-provisioner", filepath.Join(bed.Config.BinDir, "csi-provisioner"), args[1:], env); err != nil {
		return tv, err
	}
	return tv, nil
}

// command returns the container named name of spec with its command moved
// into its args, as hypertopolvm takes them: the command's base name
// (topolvm-node, csi-provisioner, ...) first, then its flags.
func command(spec *corev1.PodSpec, name string) (*corev1.Container, error) {
	for _, c := range spec.Containers {
		if c.Name != name {
			continue
		}
		if len(c.Command) == 0 {
			return nil, fmt.Errorf("container %s of TopoLVM's chart has no command", name)
		}
		c.Args = append([]string{path.Base(c.Command[0])}, append(c.Command[1:], c.Args...)...)
		c.Command = nil
		return &c, nil
	}
	return nil, fmt.Errorf("TopoLVM's chart has no container %s", name)
}

// carveSpareGiB is the spare of carve's default device class, which
// TopoLVM's spare-gb matches so that both publish the same capacity.
func carveSpareGiB(bed *cluster.Cluster) (uint64, error) {
	for _, c := range bed.DeviceClasses.DeviceClasses {
		if c.Default && !c.Thin() {
			if c.Spare == nil {
				return 0, nil
			}
			if c.Spare.Value()%(1<<30) != 0 {
				return 0, fmt.Errorf("carve's default class keeps a spare of %s, not whole GiB as TopoLVM's spare-gb needs", c.Spare.String())
			}
			return uint64(c.Spare.Value() >> 30), nil
		}
	}
	return 0, errors.New("carve's shipped device classes have no default thick class")
}

// boundPod waits for the pod of a workload to be bound to a node.
func boundPod(ctx context.Context, bed *cluster.Cluster, ns string, sel map[string]string) (string, error) {
	var name string
	err := waitFor(ctx, time.Minute, "a bound pod of "+labels.FormatLabels(sel), func(ctx context.Context) (bool, string, error) {
		pods, err := bed.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labels.FormatLabels(sel)})
		if err != nil {
			return false, "", err
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				name = p.Name
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d pods, none bound", len(pods.Items)), nil
	})
	return name, err
}

// processes are TopoLVM's running processes.
func (tv *topolvm) processes() []*cluster.Process {
	var ps []*cluster.Process
	for _, p := range []*cluster.Process{tv.controller, tv.provisioner} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	for _, n := range tv.nodes {
		if n.Process != nil {
			ps = append(ps, n.Process)
		}
	}
	return ps
}

// checkAlive returns an error naming every TopoLVM process that ended.
func (tv *topolvm) checkAlive() error {
	var errs []error
	for _, p := range tv.processes() {
		if ended, err := p.Exited(); ended {
			errs = append(errs, fmt.Errorf("%s ended (%w):\n%s", p.Name, err, p.Tail(20)))
		}
	}
	return errors.Join(errs...)
}

// closeVGs removes TopoLVM's volume groups and loop devices; the test
// bed's Stop has stopped its processes before.
func (tv *topolvm) closeVGs() error {
	var errs []error
	for name, n := range tv.nodes {
		if n.VG != nil {
			if err := n.VG.Close(); err != nil {
				errs = append(errs, fmt.Errorf("TopoLVM's volume group on %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// waitFor polls cond every 250 ms until it holds or timeout passes; an
// error from cond ends the wait at once.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, status, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not happen within %s (last: %s)", what, timeout, status)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
