package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Central is the controller Deployment played by processes: every
// container of its pod (`carve controller`, csi-provisioner, csi-snapshotter
// when snapshots are on, csi-resizer) with the Deployment's own arguments,
// on one socket, each authenticated as the Deployment's service account.
type Central struct {
	// Socket is the unix socket they share (the pod's emptyDir).
	Socket string
	// MetricsURL is carve controller's /metrics.
	MetricsURL string
	// ProvisionerMetricsURL, SnapshotterMetricsURL (empty without a
	// csi-snapshotter) and ResizerMetricsURL are the sidecars' /metrics.
	ProvisionerMetricsURL, SnapshotterMetricsURL, ResizerMetricsURL string

	carve *Process
	// carveCmd starts carve controller again (RestartController);
	// carveArgs are the flags the test bed started it with.
	carveCmd                          processCmd
	carveArgs                         []string
	sidecars                          []centralSidecar
	provisioner, snapshotter, resizer *Process
}

// processCmd is what starts a process again.
type processCmd struct {
	logs, name, bin string
	args, env       []string
	lifetime        time.Duration
}

func (c processCmd) start(ctx context.Context) (*Process, error) {
	return startProcess(ctx, c.logs, c.name, c.bin, c.args, c.env, c.lifetime)
}

// centralSidecar is one sidecar of the controller Deployment.
type centralSidecar struct {
	kind string // its image's name: csi-provisioner, csi-snapshotter, csi-resizer
	cmd  processCmd
}

// isCarveController tells the container that runs `carve controller`.
var isCarveController = runsCarveRole("controller")

// isResizer tells the csi-resizer container (by its image, since its args
// hold nothing only it has).
func isResizer(c *corev1.Container) bool {
	return strings.Contains(c.Image, "/csi-resizer:")
}

// isProvisioner tells the csi-provisioner container (by its image).
func isProvisioner(c *corev1.Container) bool {
	return strings.Contains(c.Image, "/csi-provisioner:")
}

// sidecarKinds are the sidecars the controller Deployment may run, by the
// test that tells them and the name of their binary in Config.BinDir.
var sidecarKinds = []struct {
	name string
	is   func(*corev1.Container) bool
}{
	{"csi-provisioner", isProvisioner},
	{"csi-snapshotter", isSnapshotter},
	{"csi-resizer", isResizer},
}

// sidecarKind names the sidecar c is, or "".
func sidecarKind(c *corev1.Container) string {
	for _, k := range sidecarKinds {
		if k.is(c) {
			return k.name
		}
	}
	return ""
}

// checkControllerContainers returns an error unless the Deployment runs
// carve controller, csi-provisioner and csi-resizer, and nothing the
// harness cannot run (a container it does not know would silently not run).
func checkControllerContainers(d *appsv1.Deployment) error {
	owner := "Deployment " + d.Namespace + "/" + d.Name
	spec := &d.Spec.Template.Spec
	var errs []error
	for _, what := range []struct {
		name string
		is   func(*corev1.Container) bool
	}{{"carve controller", isCarveController}, {"csi-provisioner", isProvisioner}, {"csi-resizer", isResizer}} {
		if _, err := findContainer(spec, owner, what.name, what.is); err != nil {
			errs = append(errs, err)
		}
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		if !isCarveController(c) && sidecarKind(c) == "" {
			errs = append(errs, fmt.Errorf("%s runs container %s (%s), which the test bed does not run", owner, c.Name, c.Image))
		}
	}
	return errors.Join(errs...)
}

// startCentral starts carve controller from the Deployment's carve
// container and waits for its socket; startSidecars starts the rest.
// Every process authenticates as the Deployment's service account, so
// carve's RBAC is what it gets. In a pod, client-go would read the
// leader-election namespace from the service account's namespace file; a
// process here has none, so the harness passes it as a flag.
func startCentral(ctx context.Context, cs kubernetes.Interface, cp *ControlPlane, d *appsv1.Deployment, carveBin, dir, logs string, extra []string, lifetime time.Duration) (*Central, error) {
	if err := checkControllerContainers(d); err != nil {
		return nil, err
	}
	spec := &d.Spec.Template.Spec
	carveC, err := findContainer(spec, "Deployment "+d.Namespace+"/"+d.Name, "carve controller", isCarveController)
	if err != nil {
		return nil, err
	}
	c := &Central{Socket: filepath.Join(dir, "csi.sock")}
	pod := PodFields{Namespace: d.Namespace}
	carvePort, err := FreePort()
	if err != nil {
		return nil, err
	}
	c.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", carvePort)
	kubeconfig := filepath.Join(dir, "controller.kubeconfig")
	if err := serviceAccountKubeconfig(ctx, cs, cp, d.Namespace, spec.ServiceAccountName, kubeconfig, lifetime); err != nil {
		return nil, fmt.Errorf("the controller Deployment's service account: %w", err)
	}
	flags := []FlagValue{
		{"endpoint", "unix://" + c.Socket},
		{"metrics-address", fmt.Sprintf("127.0.0.1:%d", carvePort)},
		{"kubeconfig", kubeconfig},
		{"leader-election-namespace", d.Namespace},
	}
	for _, a := range extra {
		name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		flags = append(flags, FlagValue{name, value})
	}
	args, env, err := ContainerCommand(carveC, pod, flags)
	if err != nil {
		return nil, err
	}
	bin, err := containerProgram(carveBin, carveC)
	if err != nil {
		return nil, err
	}
	c.carveCmd = processCmd{logs: logs, name: "controller-carve", bin: bin, args: args, env: env, lifetime: lifetime}
	c.carveArgs = slices.Clone(args)
	klog.InfoS("Starting carve controller with the Deployment's flags", "args", args)
	if err := c.startCarve(ctx); err != nil {
		return c, err
	}
	return c, nil
}

// startCarve starts carve controller and waits for its socket.
func (c *Central) startCarve(ctx context.Context) error {
	var err error
	if c.carve, err = c.carveCmd.start(ctx); err != nil {
		return err
	}
	return waitSocket(ctx, c.carve, c.Socket, 60*time.Second)
}

// startSidecars starts every sidecar container of the Deployment (binaries
// in binDir) on carve controller's socket.
func (c *Central) startSidecars(ctx context.Context, cs kubernetes.Interface, cp *ControlPlane, d *appsv1.Deployment, binDir, dir, logs string, lifetime time.Duration) error {
	spec := &d.Spec.Template.Spec
	pod := PodFields{Namespace: d.Namespace}
	for i := range spec.Containers {
		ct := &spec.Containers[i]
		kind := sidecarKind(ct)
		if kind == "" {
			continue
		}
		s := sidecar{name: "controller-" + kind, container: ct, pod: pod, serviceAccount: spec.ServiceAccountName,
			bin: filepath.Join(binDir, kind), socket: c.Socket,
			extra: []FlagValue{{"leader-election-namespace", d.Namespace}}}
		cmd, url, err := sidecarCommand(ctx, cs, cp, s, dir, logs, lifetime)
		if err != nil {
			return err
		}
		c.sidecars = append(c.sidecars, centralSidecar{kind: kind, cmd: cmd})
		switch kind {
		case "csi-provisioner":
			c.ProvisionerMetricsURL = url
		case "csi-snapshotter":
			c.SnapshotterMetricsURL = url
		case "csi-resizer":
			c.ResizerMetricsURL = url
		}
	}
	return c.startSidecarProcesses(ctx)
}

// startSidecarProcesses starts the sidecars' processes.
func (c *Central) startSidecarProcesses(ctx context.Context) error {
	for _, s := range c.sidecars {
		klog.InfoS("Starting a sidecar with its manifest's flags", "sidecar", s.cmd.name, "args", s.cmd.args)
		p, err := s.cmd.start(ctx)
		if err != nil {
			return err
		}
		switch s.kind {
		case "csi-provisioner":
			c.provisioner = p
		case "csi-snapshotter":
			c.snapshotter = p
		case "csi-resizer":
			c.resizer = p
		}
	}
	return nil
}

// RestartController ends carve controller as a crash would (SIGKILL, no
// grace) and starts it again with the same flags. The sidecars exit when
// their CSI connection is lost and the kubelet would start them again: the
// harness stops and starts them too. It returns once the new carve
// controller serves its socket. ctx bounds the wait only: the new
// processes live as long as the test bed (its lifetime, Stop), not as
// long as the caller's ctx.
func (c *Central) RestartController(ctx context.Context) error {
	if err := syscall.Kill(c.carve.Pid(), syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill carve controller: %w", err)
	}
	c.carve.Stop() // reaps it
	for _, p := range started(c.provisioner, c.snapshotter, c.resizer) {
		p.Stop()
	}
	if err := os.Remove(c.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	live := context.WithoutCancel(ctx)
	if err := c.startCarve(live); err != nil {
		return err
	}
	return c.startSidecarProcesses(live)
}

// RestartControllerWith is RestartController with extra flags
// ("--name=value", after the Deployment's, so they win) from now on; nil
// goes back to the flags the test bed started it with.
func (c *Central) RestartControllerWith(ctx context.Context, extra []string) error {
	c.carveCmd.args = append(slices.Clone(c.carveArgs), extra...)
	return c.RestartController(ctx)
}

// processes returns the running processes, the sidecars first (they stop
// before the socket they use goes).
func (c *Central) processes() []*Process {
	return started(c.provisioner, c.snapshotter, c.resizer, c.carve)
}

// exited tells whether carve controller has ended, and how; a controller
// that is not the harness's process (nil: it runs in a pod) never has.
func (c *Central) exited() (bool, error) {
	if c == nil {
		return false, nil
	}
	return c.carve.Exited()
}

// tail is the end of carve controller's log, or where to look for it when
// it runs in a pod.
func (c *Central) tail(n int) string {
	if c == nil {
		return "(carve controller runs in a pod of a guest node: see its container log)"
	}
	return c.carve.Tail(n)
}

// Controller is the `carve controller` process.
func (c *Central) Controller() *Process { return c.carve }

// Provisioner is the csi-provisioner process.
func (c *Central) Provisioner() *Process { return c.provisioner }

// Snapshotter is the csi-snapshotter process, or nil when the Deployment
// runs none.
func (c *Central) Snapshotter() *Process { return c.snapshotter }

// Resizer is the csi-resizer process.
func (c *Central) Resizer() *Process { return c.resizer }
