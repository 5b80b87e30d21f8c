package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// Central is the controller Deployment played by processes: `carve
// controller` and csi-resizer, on one socket, with the Deployment's own
// arguments.
type Central struct {
	// Socket is the unix socket the two share (the pod's emptyDir).
	Socket string
	// ResizerMetricsURL is csi-resizer's /metrics.
	ResizerMetricsURL string
	// MetricsURL is carve controller's /metrics.
	MetricsURL string

	carve, resizer *Process
}

// isCarveController tells the container that runs `carve controller`.
var isCarveController = runsCarveRole("controller")

// isResizer tells the csi-resizer container (by its image, since its args
// hold nothing only it has).
func isResizer(c *corev1.Container) bool {
	return strings.Contains(c.Image, "/csi-resizer:")
}

// startCentral starts the controller Deployment's two containers as
// processes. csi-resizer authenticates as the Deployment's service account,
// so carve's RBAC is what it gets. In a pod, client-go would read the
// leader-election namespace from the service account's namespace file;
// a process here has none, so the harness passes it as a flag.
func startCentral(ctx context.Context, cs kubernetes.Interface, cp *ControlPlane, d *appsv1.Deployment, carveBin, resizerBin, dir, logs string, extra []string, lifetime time.Duration) (*Central, error) {
	owner := "Deployment " + d.Namespace + "/" + d.Name
	spec := &d.Spec.Template.Spec
	carveC, err := findContainer(spec, owner, "carve controller", isCarveController)
	if err != nil {
		return nil, err
	}
	resizerC, err := findContainer(spec, owner, "csi-resizer", isResizer)
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
	// carve controller watches Nodes and PVs as the Deployment's service
	// account, like csi-resizer below.
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
	klog.InfoS("Starting carve controller with the Deployment's flags", "args", args)
	if c.carve, err = startProcess(ctx, logs, "controller-carve", carveBin, args, env, lifetime); err != nil {
		return nil, err
	}
	if err := waitSocket(ctx, c.carve, c.Socket, 60*time.Second); err != nil {
		return c, err
	}

	c.resizer, c.ResizerMetricsURL, err = startSidecar(ctx, cs, cp, sidecar{name: "controller-csi-resizer", container: resizerC,
		pod: pod, serviceAccount: spec.ServiceAccountName, bin: resizerBin, socket: c.Socket,
		extra: []FlagValue{{"leader-election-namespace", d.Namespace}}}, dir, logs, lifetime)
	return c, err
}

// processes returns the running processes.
func (c *Central) processes() []*Process { return started(c.resizer, c.carve) }

// Resizer is the csi-resizer process.
func (c *Central) Resizer() *Process { return c.resizer }

// Controller is the `carve controller` process.
func (c *Central) Controller() *Process { return c.carve }
