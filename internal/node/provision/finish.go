package provision

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// EraseMethodFor is how a new volume of class is erased before it is handed
// out. Only raw-block thick volumes are: a filesystem never returns blocks
// it did not write, and a thin volume in a zeroing pool reads zeros.
func EraseMethodFor(class *deviceclass.DeviceClass, block bool) erase.Method {
	if class.Thin() || !block {
		return erase.None
	}
	return class.EraseMethod()
}

// clearsSignatures: a thick, empty filesystem volume.
func clearsSignatures(r *Request) bool {
	return !r.Class.Thin() && r.Source == nil && !r.Block && r.Encryption == nil
}

// finish zeroes a new LV when method asks, then clears its mark. The work
// runs detached from ctx, so a CreateVolume past its deadline does not throw
// away an erasure half done: that call gets ErrBusy and the retry waits for
// the same work. clearSignatures zeroes the signature regions of a new
// empty thick filesystem volume, so that NodeStage skips blkid.
func (p *Provisioner) finish(ctx context.Context, lv *lvm.LogicalVolume, made bool, class *deviceclass.DeviceClass, method erase.Method, clearSignatures bool) (*lvm.LogicalVolume, error) {
	if half, err := p.unfinished(lv); err != nil || !half {
		return lv, err
	}
	work := *lv
	j, _ := p.finishing.Start(ctx, lv.Name, "", func(jobCtx context.Context) (*lvm.LogicalVolume, error) {
		return p.finishLV(jobCtx, &work, made, class, method, clearSignatures)
	})
	if !j.Wait(ctx) {
		return nil, errorf(ErrBusy, "volume %s is still being prepared (erase method %s, %d bytes); retry later: %v",
			volume.VolumeID(lv.VolumeGroup, lv.Name), method, lv.Size, ctx.Err())
	}
	done, err := j.Result()
	if err != nil {
		return nil, wrap(err, "finishing volume "+volume.VolumeID(lv.VolumeGroup, lv.Name))
	}
	return done, nil
}

func (p *Provisioner) finishLV(ctx context.Context, lv *lvm.LogicalVolume, made bool, class *deviceclass.DeviceClass, method erase.Method, clearSignatures bool) (*lvm.LogicalVolume, error) {
	log := klog.FromContext(ctx).WithValues("lv", lv.Name, "vg", lv.VolumeGroup)
	if !made {
		// LVM and the marks decide: zeroing a handed-out volume destroys data.
		cur, err := p.cfg.LVM.GetLV(ctx, lv.VolumeGroup, lv.Name)
		if err != nil {
			return nil, fmt.Errorf("reading %s/%s before finishing it: %w", lv.VolumeGroup, lv.Name, err)
		}
		half, err := p.unfinished(cur)
		if err != nil {
			return nil, err
		}
		if !half {
			p.cfg.View.Created(*cur)
			return cur, nil
		}
		if cur.Path == "" {
			cur.Path = lv.Path
		}
		lv = cur
	}
	if method != erase.None {
		start := time.Now()
		n, err := p.cfg.Eraser.Erase(ctx, lv.Path, method)
		if errors.Is(err, fs.ErrNotExist) {
			var act *lvm.LogicalVolume
			if act, err = p.cfg.LVM.ActivateLV(ctx, lv.VolumeGroup, lv.Name); err == nil {
				n, err = p.cfg.Eraser.Erase(ctx, act.Path, method)
			}
		}
		p.cfg.Metrics.ObserveStep(metrics.PhaseCreate, metrics.StepErase, class.Name, time.Since(start), err)
		if err != nil {
			log.Error(err, "Erasing a new volume failed; the next CreateVolume of it tries again")
			return nil, fmt.Errorf("erasing %s/%s: %w", lv.VolumeGroup, lv.Name, err)
		}
		log.Info("Erased new volume", "method", method, "bytes", n, "duration", time.Since(start))
	}
	flushed := method != erase.None
	if method == erase.None && clearSignatures {
		start := time.Now()
		n, err := p.cfg.Eraser.Erase(ctx, lv.Path, erase.Signatures)
		if err != nil {
			log.Info("Could not zero the signature regions of a new volume; NodeStage will ask blkid", "err", err)
		} else {
			flushed = true
			log.V(2).Info("Zeroed the signature regions of a new volume", "bytes", n, "duration", time.Since(start))
		}
	}
	if !flushed {
		// lvm2 leaves metadata in the disk's cache: flush, or a power cut undoes it.
		if _, err := p.cfg.Eraser.Erase(ctx, lv.Path, erase.Flush); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("flushing new volume %s/%s: %w", lv.VolumeGroup, lv.Name, err)
		}
	}
	if err := p.cfg.Marks.Clear(lv.VolumeGroup, lv.Name); err != nil {
		return nil, err
	}
	p.cfg.View.Created(*lv)
	return lv, nil
}
