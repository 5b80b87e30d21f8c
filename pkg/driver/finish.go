package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/erase"
	"github.com/carve-csi/carve/pkg/metrics"
	"github.com/carve-csi/carve/pkg/volume"
)

// Eraser zeroes the device at path with method m and returns how many
// bytes it zeroed; an error wrapping fs.ErrNotExist when the device node
// does not exist. EraseDevice is the real one.
type Eraser interface {
	Erase(ctx context.Context, path string, m erase.Method) (int64, error)
}

// EraseDevice is the Eraser of real devices (erase.Device).
type EraseDevice struct{}

// Erase implements Eraser.
func (EraseDevice) Erase(ctx context.Context, path string, m erase.Method) (int64, error) {
	return erase.Device(ctx, path, m)
}

// eraseMethodFor is how a new volume of class is erased before it is
// handed out. Only raw-block volumes of thick classes are: a filesystem
// never returns blocks it did not write through its files, and a thin
// volume reads zeros where it was never written when its pool zeroes new
// blocks (see the pool check at start-up).
func eraseMethodFor(class *config.DeviceClass, caps []*csi.VolumeCapability) erase.Method {
	if class.Thin() {
		return erase.None
	}
	for _, c := range caps {
		if c.GetBlock() != nil {
			return class.EraseMethod()
		}
	}
	return erase.None
}

// finishJobs are the finishings in flight, keyed by LV name. A finishing
// outlives the CreateVolume that started it (erasing a large volume takes
// longer than csi-provisioner's deadline); the retries wait for it.
type finishJobs struct {
	mu   sync.Mutex
	jobs map[string]*finishJob
}

type finishJob struct {
	done chan struct{}
	lv   *lvm.LogicalVolume
	err  error
}

// running tells whether the LV's finishing is in flight.
func (f *finishJobs) running(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.jobs[name]
	return ok
}

// start returns the finishing of name in flight, or starts run as it.
func (f *finishJobs) start(name string, run func() (*lvm.LogicalVolume, error)) *finishJob {
	f.mu.Lock()
	defer f.mu.Unlock()
	if j, ok := f.jobs[name]; ok {
		return j
	}
	if f.jobs == nil {
		f.jobs = map[string]*finishJob{}
	}
	j := &finishJob{done: make(chan struct{})}
	f.jobs[name] = j
	go func() {
		j.lv, j.err = run()
		f.mu.Lock()
		delete(f.jobs, name)
		f.mu.Unlock()
		close(j.done)
	}()
	return j
}

// finish makes a new LV ready to hand out: it zeroes it when method asks
// for it, then takes volume.TagUnfinished off. An LV without the tag is returned
// as it is. The work runs detached from ctx, so that a CreateVolume whose
// deadline passes does not throw away an erasure half done: that call gets
// Aborted (csi-provisioner retries and keeps the node), and the retry
// waits for the same work.
//
// made says the LV was made by this call's lvcreate, so LVM need not be
// asked whether it is still unfinished.
func (s *ControllerServer) finish(ctx context.Context, lv *lvm.LogicalVolume, made bool, class *config.DeviceClass, method erase.Method) (*lvm.LogicalVolume, error) {
	if !volume.IsUnfinished(lv.Tags) {
		return lv, nil
	}
	work := *lv
	jobCtx := context.WithoutCancel(ctx)
	j := s.finishing.start(lv.Name, func() (*lvm.LogicalVolume, error) {
		return s.finishLV(jobCtx, &work, made, class, method)
	})
	select {
	case <-j.done:
		if j.err != nil {
			return nil, toStatus(j.err, "finishing volume "+volume.VolumeID(lv.VolumeGroup, lv.Name))
		}
		return j.lv, nil
	case <-ctx.Done():
		return nil, status.Errorf(codes.Aborted, "volume %s is still being prepared (erase method %s, %d bytes); retry later: %v",
			volume.VolumeID(lv.VolumeGroup, lv.Name), method, lv.Size, ctx.Err())
	}
}

// finishLV is the work of finish.
func (s *ControllerServer) finishLV(ctx context.Context, lv *lvm.LogicalVolume, made bool, class *config.DeviceClass, method erase.Method) (*lvm.LogicalVolume, error) {
	log := klog.FromContext(ctx).WithValues("lv", lv.Name, "vg", lv.VolumeGroup)
	if !made {
		// LVM, not the view, says whether the LV is still unfinished: a
		// view read before an earlier finishing ended still shows the
		// mark, and zeroing a volume already handed out would destroy its
		// data.
		cur, err := s.cfg.LVM.GetLV(ctx, lv.VolumeGroup, lv.Name)
		if err != nil {
			return nil, fmt.Errorf("reading %s/%s before finishing it: %w", lv.VolumeGroup, lv.Name, err)
		}
		if !volume.IsUnfinished(cur.Tags) {
			s.cfg.View.Created(*cur)
			return cur, nil
		}
		if cur.Path == "" {
			cur.Path = lv.Path
		}
		lv = cur
	}
	if method != erase.None {
		start := time.Now()
		n, err := s.cfg.Eraser.Erase(ctx, lv.Path, method)
		if errors.Is(err, fs.ErrNotExist) {
			// No device node: the LV is inactive (lvm.conf's activation
			// settings, or a reboot since lvcreate).
			var act *lvm.LogicalVolume
			if act, err = s.cfg.LVM.ActivateLV(ctx, lv.VolumeGroup, lv.Name); err == nil {
				n, err = s.cfg.Eraser.Erase(ctx, act.Path, method)
			}
		}
		s.cfg.Metrics.ObserveStep(metrics.PhaseCreate, metrics.StepErase, class.Name, time.Since(start), err)
		if err != nil {
			log.Error(err, "Erasing a new volume failed; the next CreateVolume of it tries again")
			return nil, fmt.Errorf("erasing %s/%s: %w", lv.VolumeGroup, lv.Name, err)
		}
		log.Info("Erased new volume", "method", method, "bytes", n, "duration", time.Since(start))
	}
	if err := s.cfg.LVM.DeleteTags(ctx, lv.VolumeGroup, lv.Name, volume.TagUnfinished); err != nil {
		return nil, fmt.Errorf("marking %s/%s finished: %w", lv.VolumeGroup, lv.Name, err)
	}
	lv.Tags = slices.DeleteFunc(slices.Clone(lv.Tags), func(t string) bool { return t == volume.TagUnfinished })
	s.cfg.View.Created(*lv)
	return lv, nil
}
