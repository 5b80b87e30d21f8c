package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/node/marks"
)

// stateKinds: volumes being made, filesystems being made.
var stateKinds = []string{"unfinished", "formatting"}

// openState opens the marks, refused on a filesystem a reboot empties
// unless --allow-volatile-state-dir.
func openState(ctx context.Context, o *NodeOptions) (unfinished, formatting *marks.Marks, err error) {
	dir, err := o.stateDir()
	if err != nil {
		return nil, nil, err
	}
	if err := refuseVolatile(ctx, dir, o.AllowVolatileStateDir); err != nil {
		return nil, nil, err
	}
	opened := make([]*marks.Marks, len(stateKinds))
	for i, kind := range stateKinds {
		m, err := marks.Open(filepath.Join(dir, kind))
		if err != nil {
			return nil, nil, fmt.Errorf("--state-dir %s: %w", dir, err)
		}
		opened[i] = m
	}
	return opened[0], opened[1], nil
}

// refuseVolatile judges a missing dir by its nearest existing parent.
func refuseVolatile(ctx context.Context, dir string, allow bool) error {
	probe := dir
	for {
		fsName, err := marks.Volatile(probe)
		if err == nil {
			if fsName == "" {
				return nil
			}
			if allow {
				klog.FromContext(ctx).Info("The state directory is on a filesystem a reboot empties; carve's marks will not outlive one (--allow-volatile-state-dir)",
					"stateDir", dir, "filesystem", fsName)
				return nil
			}
			return fmt.Errorf("--state-dir %s is on %s, which a reboot empties: carve's marks of volumes being made and formatted would be lost with the node's power, and a half-erased volume handed out; "+
				"give carve a directory on the node's disk (the DaemonSet mounts the host's /var/lib/carve), or pass --allow-volatile-state-dir to accept the risk", dir, fsName)
		}
		parent := filepath.Dir(probe)
		if !errors.Is(err, fs.ErrNotExist) || parent == probe {
			return fmt.Errorf("--state-dir %s: %w", dir, err)
		}
		probe = parent
	}
}
