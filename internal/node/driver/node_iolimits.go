package driver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/node/iolimit"
	"github.com/carve-csi/carve/internal/volume"
)

// Results of carve_io_limit_applications_total.
const (
	limitOK          = "ok"
	limitUnsupported = "unsupported"
	limitNoPod       = "no-pod"
	limitError       = "error"
)

func (n *NodeServer) limitsOf(vol volume.ID) volume.IOLimits {
	if n.cfg.View == nil {
		return volume.IOLimits{}
	}
	lv, ok := n.cfg.View.FindLV(vol.LV)
	if !ok || lv.VolumeGroup != vol.VG {
		return volume.IOLimits{}
	}
	return volume.IOLimitsFromTags(lv.Tags)
}

// limitTarget applies vol's IO limits to the target's pod at publish: a node
// that cannot is FAILED_PRECONDITION, a missing pod cgroup UNAVAILABLE.
func (n *NodeServer) limitTarget(ctx context.Context, vol volume.ID, device, target string) error {
	limits := n.limitsOf(vol)
	if !limits.Any() {
		return nil
	}
	if err := n.limit(device, target, limits); err != nil {
		return limitStatus(vol, err)
	}
	klog.FromContext(ctx).Info("Applied IO limits", "volumeID", vol.String(), "targetPath", target, "limits", limits.String())
	return nil
}

func (n *NodeServer) limit(device, target string, limits volume.IOLimits) error {
	err := n.writeLimit(device, target, limits)
	switch {
	case err == nil:
		n.cfg.Metrics.CountIOLimitApplication(limitOK)
	case errors.Is(err, iolimit.ErrUnsupported):
		n.cfg.Metrics.CountIOLimitApplication(limitUnsupported)
	case errors.Is(err, iolimit.ErrNoPod):
		n.cfg.Metrics.CountIOLimitApplication(limitNoPod)
	default:
		n.cfg.Metrics.CountIOLimitApplication(limitError)
	}
	return err
}

func (n *NodeServer) writeLimit(device, target string, limits volume.IOLimits) error {
	if _, err := n.cfg.Cgroups.Support(); err != nil {
		return err
	}
	uid, ok := iolimit.PodUID(target)
	if !ok {
		return fmt.Errorf("target path %s is not a kubelet's pod volume path, so its pod is not known", target)
	}
	dir, err := n.cfg.Cgroups.PodDir(uid)
	if err != nil {
		return err
	}
	dev, err := n.deviceOf(device)
	if err != nil {
		return err
	}
	return n.cfg.Cgroups.Set(dir, dev, limits)
}

func limitStatus(vol volume.ID, err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, iolimit.ErrUnsupported):
		code = codes.FailedPrecondition
	case errors.Is(err, iolimit.ErrNoPod):
		code = codes.Unavailable
	}
	return status.Errorf(code, "volume %q has IO limits and they could not be applied: %v", vol, err)
}

// ApplyIOLimits implements LimitApplier under the volume's lock, so no
// publish runs beside it with the limits it read before.
func (n *NodeServer) ApplyIOLimits(ctx context.Context, vol volume.ID, limits volume.IOLimits) (int, error) {
	if err := n.acquire(vol.String()); err != nil {
		return 0, err
	}
	defer n.release(vol.String())
	if _, err := n.cfg.Cgroups.Support(); err != nil && limits.Any() {
		n.cfg.Metrics.CountIOLimitApplication(limitUnsupported)
		return 0, status.Errorf(codes.FailedPrecondition, "volume %q: the IO limits are recorded on the volume but node %s cannot apply them: %v", vol, n.cfg.NodeName, err)
	}
	device := n.device(vol)
	if !n.isDeviceNode(device) {
		return 0, nil // inactive: published nowhere
	}
	// Pods of an encrypted volume use its opened device's numbers.
	device = n.openedDevice(vol, device)
	targets, err := n.cfg.FS.MountsOf(device)
	if err != nil {
		return 0, status.Errorf(codes.Internal, "listing the mounts of %s: %v", device, err)
	}
	var errs []error
	applied := 0
	for _, t := range targets {
		if _, ok := iolimit.PodUID(t); !ok {
			continue // the staging path, or a mount that is no pod's
		}
		if err := n.limit(device, t, limits); err != nil {
			errs = append(errs, err)
			continue
		}
		applied++
	}
	if err := errors.Join(errs...); err != nil {
		return applied, limitStatus(vol, err)
	}
	return applied, nil
}

// ReapplyIOLimits applies every volume's IO limits at the agent's start; it
// returns the first failure.
func (n *NodeServer) ReapplyIOLimits(ctx context.Context) error {
	if n.cfg.View == nil {
		return nil
	}
	reason, supportErr := n.cfg.Cgroups.Support()
	n.cfg.Metrics.SetIOLimitSupport(reason)
	log := klog.FromContext(ctx)
	if supportErr != nil {
		log.Info("This node cannot apply IO limits; a volume with limits is refused at publish", "reason", reason, "err", supportErr.Error())
	}
	var first error
	for _, lv := range n.cfg.View.Volumes() {
		limits := volume.IOLimitsFromTags(lv.Tags)
		if !limits.Any() {
			continue
		}
		vol := volume.ID{VG: lv.VolumeGroup, LV: lv.Name}
		if k, err := n.ApplyIOLimits(ctx, vol, limits); err != nil {
			log.Error(err, "Applying IO limits at start failed", "volumeID", vol.String())
			if first == nil {
				first = err
			}
		} else if k > 0 {
			log.Info("Applied IO limits at start", "volumeID", vol.String(), "limits", limits.String(), "pods", k)
		}
	}
	return first
}
