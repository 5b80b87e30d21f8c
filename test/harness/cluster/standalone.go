package cluster

import (
	"context"
	"os"
	"path/filepath"
	"time"
)

// StartControlPlane starts a control plane of its own (etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager from binDir,
// files and logs under dir) beside any test bed: for installs that must
// not touch the bed's objects (test/e2e's install from the release
// artifacts). No nodes join it. Stop it with Stop.
func StartControlPlane(ctx context.Context, binDir, dir string, lifetime time.Duration) (*ControlPlane, error) {
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	return startControlPlane(ctx, binDir, dir, lifetime, controlPlaneOptions{})
}
