package provision

import (
	"github.com/carve-csi/carve/internal/copyticket"

	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// A restore or clone on another node than its source's is a copy across
// nodes: carve controller grants one read of the source (a RemoteSource in
// the context). The LV stays tagged volume.TagCopyPending until the Puller
// checked the data's digest as received and as read back, so a copy cut
// short is never handed out; the retry redoes it with a new grant.

// RemoteSource is the copy ticket carve controller granted.
type RemoteSource = copyticket.Ticket

// Puller fills dst from a remote source, checks its digest, syncs and reads
// back; sparse leaves zero chunks unwritten.
type Puller interface {
	Pull(ctx context.Context, src RemoteSource, dst string, sparse bool, progress func(uint64)) (blockcopy.Result, error)
}

type remoteKey struct{}

// WithRemoteSource returns ctx carrying src for the CreateVolume it serves.
func WithRemoteSource(ctx context.Context, src *RemoteSource) context.Context {
	return context.WithValue(ctx, remoteKey{}, src)
}

// RemoteSourceFrom is the RemoteSource ctx carries, or nil.
func RemoteSourceFrom(ctx context.Context) *RemoteSource {
	rs, _ := ctx.Value(remoteKey{}).(*RemoteSource)
	return rs
}

func (p *Provisioner) remoteSourceFor(ctx context.Context, cs *Source) *RemoteSource {
	rs := RemoteSourceFrom(ctx)
	if rs == nil || rs.ID != cs.ID || rs.Snapshot != cs.Snapshot || rs.Node == p.cfg.NodeName {
		return nil
	}
	return rs
}

func (p *Provisioner) resolveRemote(rs *RemoteSource) (*contentSource, error) {
	if p.cfg.Puller == nil {
		return nil, errorf(ErrElsewhere, "volume_content_source: %s lives on node %s, and this node copies from no other node", rs.ID, rs.Node)
	}
	if rs.Size == 0 {
		return nil, errorf(ErrRefused, "volume_content_source: %s on node %s: its size is unknown", rs.ID, rs.Node)
	}
	return &contentSource{size: rs.Size, id: rs.ID, snapshot: rs.Snapshot, remote: rs}, nil
}

func (p *Provisioner) pullInto(ctx context.Context, dst *lvm.LogicalVolume, class *deviceclass.DeviceClass, src *contentSource, phase string, sparse bool) (*lvm.LogicalVolume, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), copyTimeout)
	defer cancel()
	rs := src.remote
	log := klog.FromContext(ctx).WithValues("lv", dst.Name, "source", src.id, "sourceNode", rs.Node)
	write, _, err := p.copyDevice(ctx, dst, "target")
	if err != nil {
		return nil, err
	}
	t := time.Now()
	var copied uint64
	res, err := p.cfg.Puller.Pull(ctx, *rs, p.devicePath(write), sparse, func(n uint64) {
		p.cfg.Metrics.AddCopiedBytes(phase, class.Name, n-copied)
		copied = n
	})
	p.cfg.Metrics.ObserveStep(phase, metrics.StepCopy, class.Name, time.Since(t), err)
	if err != nil {
		return nil, errorf(ErrInternal, "copying %s from node %s into %s (%d of %d bytes done; a retry copies again): %v", src.id, rs.Node, dst.Name, res.Bytes, src.size, err)
	}
	done, err := p.copied(ctx, write)
	if err != nil {
		return nil, err
	}
	log.Info("Copied the volume's data from another node", "bytes", res.Bytes, "skippedZeros", res.Skipped, "duration", res.Duration)
	return done, nil
}

// copied removes the copy-pending tag once the data is synced.
func (p *Provisioner) copied(ctx context.Context, lv *lvm.LogicalVolume) (*lvm.LogicalVolume, error) {
	if err := p.cfg.LVM.DeleteTags(ctx, lv.VolumeGroup, lv.Name, volume.TagCopyPending); err != nil {
		return nil, wrap(err, "marking the copy into "+lv.Name+" finished")
	}
	done := *lv
	done.Tags = withoutTag(lv.Tags, volume.TagCopyPending)
	p.cfg.View.Created(done)
	return &done, nil
}

// SourceSize is a local source's volume size, for a copy elsewhere.
func (p *Provisioner) SourceSize(ctx context.Context, id string, snapshot bool) (uint64, error) {
	src, err := p.resolveLocal(ctx, &Source{ID: id, Snapshot: snapshot})
	if err != nil {
		return 0, err
	}
	return src.size, nil
}

// ReadSource gives read the device node and volume size of a snapshot or
// volume, for one copy to another node. A volume is read through a
// temporary snapshot (named after target) so the copy is of one moment. A
// copy-on-write snapshot that overflowed while read fails it (ErrRefused).
func (p *Provisioner) ReadSource(ctx context.Context, id string, snapshot bool, target string, read func(device string, size uint64) error) error {
	src, err := p.resolveLocal(ctx, &Source{ID: id, Snapshot: snapshot})
	if err != nil {
		return err
	}
	from := src.lv
	if !snapshot {
		lvName := volume.LVNameFor(target)
		unlock, err := p.Lock(volume.CopySourceLVNameFor(lvName), "the copy of "+id+" for volume "+target)
		if err != nil {
			return err
		}
		defer unlock()
		cname, ok := volume.ClassFromTags(src.lv.Tags)
		class, known := p.cfg.Classes.Class(cname)
		if !ok || !known {
			return errorf(ErrRefused, "volume_content_source: volume %s has no device class of node %s (tag %q)", id, p.cfg.NodeName, cname)
		}
		if from, err = p.copySource(ctx, lvName, class, &src.lv); err != nil {
			return err
		}
		defer p.removeCopySource(context.WithoutCancel(ctx), from.VolumeGroup, from.Name)
	}
	dev, activated, err := p.copyDevice(ctx, &from, "source")
	if err != nil {
		return err
	}
	if activated && snapshot {
		defer p.deactivateAfterCopy(context.WithoutCancel(ctx), dev)
	}
	if err := SnapshotUsable(dev); err != nil {
		return errorf(ErrRefused, "source %s: %v", id, err)
	}
	rerr := read(p.devicePath(dev), src.size)
	unusable, aerr := p.sourceSpent(ctx, dev)
	if aerr == nil && unusable != nil {
		return errorf(ErrRefused, "source %s ran out of its snapshot space while it was read; the copy is not used: %v", id, unusable)
	}
	if rerr != nil {
		return rerr
	}
	if aerr != nil {
		return wrap(aerr, "reading the copy's source "+from.VolumeGroup+"/"+from.Name+" after the copy")
	}
	return nil
}
