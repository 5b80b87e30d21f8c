package driver

import (
	"context"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/capability"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/node/jobs"
	"github.com/carve-csi/carve/internal/volume"
)

// NodeStageVolume implements csi.NodeServer: a device without any signature
// is formatted, then mounted at the staging path. mkfs or fsck+mount run as
// a detached job holding the volume's lock: on a large volume they outlast
// the kubelet's deadline, and killing them would restart every retry from
// zero. A call whose deadline comes first answers ABORTED; a retry joins the
// job or takes its result.
func (n *NodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (resp *csi.NodeStageVolumeResponse, err error) {
	op := n.begin(metrics.PhaseStage)
	defer op.End(&err)

	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	access, err := stageAccess(id, staging, req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	options := stagingOptions(access)
	args := stageArgs(staging, access, options)
	if j, ok := n.staging.Get(id); ok {
		op.SetClass(n.classForMetrics(id))
		if j.Args == args {
			return n.awaitStage(ctx, id, j)
		}
		if n.staging.Running(id) {
			return nil, status.Errorf(codes.Aborted, "volume %q is being staged by an earlier call with other arguments; retry later", id)
		}
		n.staging.Take(id, j)
	}
	if err := n.acquire(id); err != nil {
		return nil, err
	}
	locked := true
	defer func() {
		if locked {
			n.release(id)
		}
	}()

	vol, err := parseID(id)
	if err != nil {
		return nil, err
	}
	device, class, err := n.activeDevice(ctx, vol, req.GetVolumeContext())
	op.SetClass(class)
	if err != nil {
		return nil, err
	}
	if device, err = n.openEncrypted(ctx, op, vol, device); err != nil {
		return nil, err
	}
	if access.Block {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	switch staged, err := n.staged(vol, device, staging, access, options); {
	case err != nil:
		return nil, err
	case staged:
		return &csi.NodeStageVolumeResponse{}, nil
	}

	job := stageJob{vol: vol, device: device, staging: staging, access: access, options: options,
		mkfsOptions: n.mkfsOptions(class, access.FSType)}
	j, started := n.staging.Start(ctx, id, args, func(ctx context.Context) (struct{}, error) {
		defer n.release(id)
		return struct{}{}, n.formatAndMount(ctx, op, job)
	})
	if !started {
		// Cannot happen: a job holds the lock to its end.
		return nil, status.Errorf(codes.Aborted, "volume %q is being staged; retry later", id)
	}
	locked = false // the job releases it
	return n.awaitStage(ctx, id, j)
}

func stageAccess(id, staging string, c *csi.VolumeCapability) (capability.Access, error) {
	if err := nodeRequireID(id); err != nil {
		return capability.Access{}, err
	}
	if err := nodeCheckPath(staging, "staging_target_path"); err != nil {
		return capability.Access{}, err
	}
	return nodeAccess(c)
}

// staged tells whether vol is staged at staging as asked, refusing anything
// else mounted there; it creates a missing staging directory.
func (n *NodeServer) staged(vol volume.ID, device, staging string, access capability.Access, options []string) (bool, error) {
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return false, status.Errorf(codes.Internal, "creating staging_target_path %s: %v", staging, err)
	}
	mp, err := n.cfg.FS.MountPoint(staging)
	if err != nil {
		return false, status.Errorf(codes.Internal, "reading the mount at %s: %v", staging, err)
	}
	if mp == nil {
		return false, nil
	}
	if !fs.SameDevice(mp.Device, device) {
		return false, status.Errorf(codes.FailedPrecondition, "staging_target_path %s holds %s, not the device of volume %q (%s)", staging, mp.Device, vol, device)
	}
	if mp.Type != "" && mp.Type != access.FSType {
		return false, status.Errorf(codes.AlreadyExists, "volume %q is staged at %s as %s; the capability asks for %s", vol, staging, mp.Type, access.FSType)
	}
	if f := flagConflict(mp.Opts, options); f != "" {
		return false, status.Errorf(codes.AlreadyExists, "volume %q is staged at %s with mount options %v; the request differs in %q", vol, staging, mp.Opts, f)
	}
	// Mounted, so mkfs ended: drop a mark a dead earlier stage left.
	return true, n.formatted(vol)
}

// stageAnswerMargin makes a waiting stage answer ABORTED before the client's
// deadline.
const stageAnswerMargin = 5 * time.Second

// awaitStage waits for a stage job: its result (handed out once), or ABORTED
// when the call's deadline comes first.
func (n *NodeServer) awaitStage(ctx context.Context, id string, j *jobs.Job[struct{}]) (*csi.NodeStageVolumeResponse, error) {
	wctx, cancel := jobs.AnswerBy(ctx, stageAnswerMargin)
	defer cancel()
	if !j.Wait(wctx) {
		klog.FromContext(ctx).Info("Stage still formatting or checking the filesystem; answering ABORTED, the retry joins it", "volumeID", id)
		return nil, status.Errorf(codes.Aborted, "volume %q is still being staged (mkfs or fsck of its filesystem is running); retry later", id)
	}
	n.staging.Take(id, j)
	if _, err := j.Result(); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// stageArgs keys a stage: a retry with the same arguments joins it.
func stageArgs(staging string, a capability.Access, options []string) string {
	return strings.Join([]string{staging, a.FSType, strings.Join(options, ",")}, "\x00")
}

type stageJob struct {
	vol                  volume.ID
	device, staging      string
	access               capability.Access
	options, mkfsOptions []string
}

func (n *NodeServer) formatAndMount(ctx context.Context, op *metrics.Op, j stageJob) error {
	if err := n.undoUnfinishedMkfs(ctx, j.vol, j.device, j.access.FSType); err != nil {
		return err
	}
	// FormatAndMount reads the signature once; it is checked here before
	// anything is formatted or mounted.
	var refused error
	res, err := n.cfg.FS.FormatAndMount(ctx, j.device, j.staging, j.access.FSType, j.options, j.mkfsOptions, func(existing string) error {
		refused = checkSignature(j.vol, j.device, existing, j.access.FSType, j.options)
		if refused == nil && existing == "" {
			// Until the stage answers, what mkfs leaves is carve's, never a pod's.
			refused = n.formatting(ctx, j.vol)
		}
		return refused
	})
	timeFormat(op, res, err)
	switch {
	case refused != nil:
		return refused
	case err != nil && !res.Probed:
		return status.Errorf(codes.Internal, "volume %q: %v", j.vol, err)
	case err != nil:
		return status.Errorf(codes.Internal, "staging volume %q: %v", j.vol, err)
	}
	if !res.Formatted {
		// A filesystem smaller than its device (restored or cloned bigger, or an
		// expansion cut short) is grown.
		if err := op.Step(metrics.StepFilesystemGrow, func() error {
			_, err := n.cfg.FS.Resize(ctx, j.device, j.staging)
			return err
		}); err != nil {
			return status.Errorf(codes.Internal, "staging volume %q: growing its filesystem to the device: %v", j.vol, err)
		}
	}
	if err := n.formatted(j.vol); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Staged volume", "volumeID", j.vol.String(), "device", j.device, "stagingPath", j.staging,
		"fsType", j.access.FSType, "readAsBlank", res.Blank, "formatted", res.Formatted, "formatDuration", res.Format, "mountDuration", res.Mount)
	return nil
}

// timeFormat records the steps FormatAndMount ran; err is the last one's.
func timeFormat(op *metrics.Op, res fs.FormatResult, err error) {
	if !res.Probed {
		if res.Probe > 0 {
			op.Took(metrics.StepSignatureCheck, res.Probe, err)
		}
		return
	}
	op.Took(metrics.StepSignatureCheck, res.Probe, nil)
	if res.Formatted {
		var mkfsErr error
		if !res.Mounted {
			mkfsErr = err
		}
		op.Took(metrics.StepMkfs, res.Format, mkfsErr)
	}
	if res.Mounted {
		op.Took(metrics.StepMount, res.Mount, err)
	}
}

// checkSignature refuses a signature the capability does not ask for
// (formatting would destroy data) and a blank device staged read-only.
func checkSignature(vol volume.ID, device, existing, fsType string, options []string) error {
	if existing != "" && existing != fsType {
		return status.Errorf(codes.FailedPrecondition, "volume %q: device %s holds %q, the capability asks for %s; carve never formats a device that has data",
			vol, device, existing, fsType)
	}
	if existing == "" && slices.Contains(options, "ro") {
		return status.Errorf(codes.FailedPrecondition, "volume %q: device %s has no filesystem and the volume is staged read-only; carve does not format it for a reader", vol, device)
	}
	return nil
}

// stagingOptions are the capability's flags, then carve's so none undoes
// them: nodev,nosuid; ro for a reader-only volume so not even a journal
// replay writes; nouuid for xfs, whose snapshots share their origin's UUID.
func stagingOptions(a capability.Access) []string {
	options := slices.Clone(a.Flags)
	if a.FSType == "xfs" && !slices.Contains(options, "nouuid") {
		options = append(options, "nouuid")
	}
	options = append(options, hardeningFlags...)
	if a.ReadOnly && !slices.Contains(options, "ro") {
		options = append(options, "ro")
	}
	return options
}

// NodeUnstageVolume implements csi.NodeServer; repeating it, or unstaging
// what was never staged, succeeds.
func (n *NodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := n.unmountAndRemove(ctx, metrics.PhaseUnstage, id, req.GetStagingTargetPath(), "staging_target_path"); err != nil {
		return nil, err
	}
	if vol, err := volume.ParseID(id); err == nil {
		if err := n.acquire(id); err != nil {
			return nil, err
		}
		err := n.closeEncrypted(ctx, vol)
		n.release(id)
		if err != nil {
			return nil, err
		}
	}
	n.forgetClass(id)
	n.staging.Forget(id)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (n *NodeServer) mkfsOptions(class, fsType string) []string {
	if n.cfg.Classes != nil && class != "" && class != metrics.UnknownClass {
		if c, ok := n.cfg.Classes.Class(class); ok {
			return c.MkfsArgs(fsType)
		}
	}
	return fs.DefaultMkfsOptions(fsType)
}
