package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// sidecar is one CSI sidecar container of a manifest, run as a process.
type sidecar struct {
	// name names the process in logs (and its kubeconfig file in dir).
	name      string
	container *corev1.Container
	// pod fills the container's downward-API environment; its namespace
	// is the service account's.
	pod            PodFields
	serviceAccount string
	// bin is the sidecar's binary; socket carve's CSI socket.
	bin, socket string
	// extra flags the harness sets besides --csi-address, --http-endpoint
	// and --kubeconfig.
	extra []FlagValue
}

// sidecarCommand prepares s with its manifest's flags, carve's socket and
// a free metrics port, authenticated as its pod's service account (a token
// from the TokenRequest API, written to a kubeconfig in dir), so carve's
// RBAC rules are exactly what it gets. It returns the command and the
// process's metrics URL.
func sidecarCommand(ctx context.Context, cs kubernetes.Interface, cp *ControlPlane, s sidecar, dir, logs string, lifetime time.Duration) (processCmd, string, error) {
	kubeconfig := filepath.Join(dir, s.name+".kubeconfig")
	if err := serviceAccountKubeconfig(ctx, cs, cp, s.pod.Namespace, s.serviceAccount, kubeconfig, lifetime); err != nil {
		return processCmd{}, "", fmt.Errorf("%s's service account %s/%s: %w", s.name, s.pod.Namespace, s.serviceAccount, err)
	}
	port, err := FreePort()
	if err != nil {
		return processCmd{}, "", err
	}
	args, env, err := ContainerCommand(s.container, s.pod, append([]FlagValue{
		{"csi-address", s.socket},
		{"http-endpoint", fmt.Sprintf("127.0.0.1:%d", port)},
		{"kubeconfig", kubeconfig},
	}, s.extra...))
	if err != nil {
		return processCmd{}, "", err
	}
	return processCmd{logs: logs, name: s.name, bin: s.bin, args: args, env: env, lifetime: lifetime},
		fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil
}
