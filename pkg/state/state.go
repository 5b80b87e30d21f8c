// Package state keeps carve's in-memory view of this node's volume groups:
// their free space, thin pools and carve's LVs. GetCapacity, ListVolumes
// and CreateVolume's idempotency lookup read it instead of running an LVM
// command per call. It is kept current three ways: every mutation carve
// makes is applied to it at once from the mutation's result, an
// asynchronous full refresh follows mutations shortly after, and a periodic
// refresh catches changes made outside carve. Each refresh also updates the
// per-class gauges of the metrics Recorder.
package state

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/metrics"
)

// Reporter reads the whole LVM state with one command; *lvm.Client
// implements it.
type Reporter interface {
	Report(ctx context.Context) (*lvm.Report, error)
}

// ErrClassUnavailable is returned for a class whose volume group (or thin
// pool) is missing from the last report.
var ErrClassUnavailable = errors.New("device class unavailable")

// View is the in-memory view. It is safe for concurrent use.
type View struct {
	reporter Reporter
	cfg      *config.Config
	rec      *metrics.Recorder
	// IsOwned decides which LVs are carve's volumes (listed, counted).
	isOwned func(lvm.LogicalVolume) (class string, ok bool)

	mu    sync.RWMutex
	vgs   map[string]lvm.VolumeGroup
	lvs   map[string]lvm.LogicalVolume // key vg/name
	pools map[string]lvm.ThinPool      // key vg/name
	// readAt is when the last successful report was taken, lastErr the
	// last refresh's error.
	readAt  time.Time
	lastErr error
	loaded  bool
	// gen counts local mutations; a refresh that started before one is
	// stale and is redone.
	gen uint64

	dirty chan struct{}
}

// New returns an empty view; call Refresh before using it. isOwned tells
// whether an LV is a carve volume and of which class (from its tags).
func New(r Reporter, cfg *config.Config, rec *metrics.Recorder, isOwned func(lvm.LogicalVolume) (string, bool)) *View {
	return &View{reporter: r, cfg: cfg, rec: rec, isOwned: isOwned,
		vgs: map[string]lvm.VolumeGroup{}, lvs: map[string]lvm.LogicalVolume{}, pools: map[string]lvm.ThinPool{},
		dirty: make(chan struct{}, 1)}
}

// Refresh reads the LVM state and replaces the view with it. On error the
// previous view is kept and Ready reports the error.
func (v *View) Refresh(ctx context.Context) error {
	v.mu.RLock()
	gen := v.gen
	v.mu.RUnlock()
	r, err := v.reporter.Report(ctx)
	now := time.Now()
	v.rec.ObserveRefresh(now, err)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err != nil {
		v.lastErr = fmt.Errorf("read LVM state: %w", err)
		return v.lastErr
	}
	v.lastErr = nil
	if v.gen != gen {
		// A mutation was applied while the report ran; the report may
		// predate it. Keep the local state and refresh again soon.
		v.markDirtyLocked()
		return nil
	}
	v.vgs = make(map[string]lvm.VolumeGroup, len(r.VolumeGroups))
	for _, vg := range r.VolumeGroups {
		v.vgs[vg.Name] = vg
	}
	v.lvs = make(map[string]lvm.LogicalVolume, len(r.LogicalVolumes))
	for _, lv := range r.LogicalVolumes {
		v.lvs[lv.VolumeGroup+"/"+lv.Name] = lv
	}
	v.pools = make(map[string]lvm.ThinPool, len(r.ThinPools))
	for _, p := range r.ThinPools {
		v.pools[p.VolumeGroup+"/"+p.Name] = p
	}
	v.readAt = r.ReadAt
	v.loaded = true
	v.publishLocked()
	return nil
}

// Run refreshes every interval, and settle after a mutation marked the
// view dirty, until ctx ends. Refresh errors are logged; Ready shows them.
func (v *View) Run(ctx context.Context, interval, settle time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-v.dirty:
			// Let a burst of mutations finish first.
			select {
			case <-ctx.Done():
				return
			case <-time.After(settle):
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		if err := v.Refresh(rctx); err != nil {
			klog.ErrorS(err, "Refreshing the volume-group view failed")
		}
		cancel()
	}
}

func (v *View) markDirtyLocked() {
	select {
	case v.dirty <- struct{}{}:
	default:
	}
}

// Ready is nil when the last refresh succeeded and every configured volume
// group and thin pool is present; otherwise it says what is missing.
func (v *View) Ready() error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.lastErr != nil {
		return v.lastErr
	}
	if !v.loaded {
		return errors.New("volume-group view not loaded yet")
	}
	var errs []error
	for i := range v.cfg.DeviceClasses {
		if err := v.classPresentLocked(&v.cfg.DeviceClasses[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (v *View) classPresentLocked(d *config.DeviceClass) error {
	if _, ok := v.vgs[d.VolumeGroup]; !ok {
		return fmt.Errorf("device class %s: volume group %q is missing: %w", d.Name, d.VolumeGroup, ErrClassUnavailable)
	}
	if d.Thin() {
		if _, ok := v.pools[d.VolumeGroup+"/"+d.ThinPool]; !ok {
			return fmt.Errorf("device class %s: thin pool %s/%s is missing: %w", d.Name, d.VolumeGroup, d.ThinPool, ErrClassUnavailable)
		}
	}
	return nil
}

// Capacity is the room of class d; ErrClassUnavailable (wrapped) when its
// VG or pool is missing.
func (v *View) Capacity(d *config.DeviceClass) (Capacity, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.capacityLocked(d)
}

func (v *View) capacityLocked(d *config.DeviceClass) (Capacity, error) {
	if err := v.classPresentLocked(d); err != nil {
		return Capacity{}, err
	}
	vg := v.vgs[d.VolumeGroup]
	if d.Thin() {
		return ThinCapacity(d, vg, v.pools[d.VolumeGroup+"/"+d.ThinPool]), nil
	}
	return ThickCapacity(d, vg), nil
}

// FindLV looks for an LV named name in the configured volume groups.
func (v *View) FindLV(name string) (lvm.LogicalVolume, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	for _, vg := range v.configuredVGs() {
		if lv, ok := v.lvs[vg+"/"+name]; ok {
			return lv, true
		}
	}
	return lvm.LogicalVolume{}, false
}

// LV returns the LV vg/name if the view holds it.
func (v *View) LV(vg, name string) (lvm.LogicalVolume, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	lv, ok := v.lvs[vg+"/"+name]
	return lv, ok
}

// Pool returns the thin pool vg/name if the view holds it.
func (v *View) Pool(vg, name string) (lvm.ThinPool, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	p, ok := v.pools[vg+"/"+name]
	return p, ok
}

// Changed asks for a full refresh soon, after a mutation whose effect the
// caller cannot describe (an lvextend, for example).
func (v *View) Changed() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen++
	v.markDirtyLocked()
}

// Volumes lists carve's volumes in the configured volume groups, sorted by
// "vg/name".
func (v *View) Volumes() []lvm.LogicalVolume {
	v.mu.RLock()
	defer v.mu.RUnlock()
	vgs := v.configuredVGs()
	var out []lvm.LogicalVolume
	for _, lv := range v.lvs {
		if !slices.Contains(vgs, lv.VolumeGroup) {
			continue
		}
		if _, ok := v.isOwned(lv); ok {
			out = append(out, lv)
		}
	}
	slices.SortFunc(out, func(a, b lvm.LogicalVolume) int {
		return strings.Compare(a.VolumeGroup+"/"+a.Name, b.VolumeGroup+"/"+b.Name)
	})
	return out
}

func (v *View) configuredVGs() []string {
	var vgs []string
	for _, d := range v.cfg.DeviceClasses {
		if !slices.Contains(vgs, d.VolumeGroup) {
			vgs = append(vgs, d.VolumeGroup)
		}
	}
	return vgs
}

// Created applies an LV that carve just made to the view, and asks for a
// full refresh soon (a mirrored LV uses more than its size, for example).
func (v *View) Created(lv lvm.LogicalVolume) {
	v.mu.Lock()
	defer v.mu.Unlock()
	key := lv.VolumeGroup + "/" + lv.Name
	if _, had := v.lvs[key]; had {
		v.lvs[key] = lv
		return
	}
	v.lvs[key] = lv
	v.applyLocked(lv, +1)
}

// Removed applies the removal of vg/name to the view and asks for a full
// refresh soon.
func (v *View) Removed(vg, name string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	key := vg + "/" + name
	lv, had := v.lvs[key]
	if !had {
		v.gen++
		v.markDirtyLocked()
		return
	}
	delete(v.lvs, key)
	v.applyLocked(lv, -1)
}

// applyLocked moves lv's size between free and used.
func (v *View) applyLocked(lv lvm.LogicalVolume, sign int) {
	v.gen++
	if lv.Pool != "" {
		pkey := lv.VolumeGroup + "/" + lv.Pool
		if p, ok := v.pools[pkey]; ok {
			if sign > 0 {
				p.VirtualSize += lv.Size
				p.ThinVolumes++
			} else {
				p.VirtualSize = sub(p.VirtualSize, lv.Size)
				p.ThinVolumes--
			}
			v.pools[pkey] = p
		}
	} else if vg, ok := v.vgs[lv.VolumeGroup]; ok {
		if sign > 0 {
			vg.Free = sub(vg.Free, lv.Size)
		} else {
			vg.Free = min(vg.Size, vg.Free+lv.Size)
		}
		if vg.ExtentSize > 0 {
			vg.FreeExtents = vg.Free / vg.ExtentSize
		}
		v.vgs[lv.VolumeGroup] = vg
	}
	v.publishLocked()
	v.markDirtyLocked()
}

// publishLocked hands the per-class state to the metrics gauges.
func (v *View) publishLocked() {
	if v.rec == nil {
		return
	}
	counts := map[string]int{}
	for _, lv := range v.lvs {
		if class, ok := v.isOwned(lv); ok {
			counts[lv.VolumeGroup+"/"+class]++
		}
	}
	var states []metrics.ClassState
	for i := range v.cfg.DeviceClasses {
		d := &v.cfg.DeviceClasses[i]
		vg, ok := v.vgs[d.VolumeGroup]
		if !ok {
			continue
		}
		s := metrics.ClassState{DeviceClass: d.Name, VolumeGroup: d.VolumeGroup,
			VGSize: vg.Size, VGFree: vg.Free, Volumes: counts[d.VolumeGroup+"/"+d.Name]}
		if c, err := v.capacityLocked(d); err == nil {
			s.AvailableCapacity = c.Available
		}
		if d.Thin() {
			p := v.pools[d.VolumeGroup+"/"+d.ThinPool]
			s.ThinPool = d.ThinPool
			s.ThinDataPercent, s.ThinMetaPercent = p.DataPercent, p.MetadataPercent
		}
		states = append(states, s)
	}
	v.rec.SetClassStates(states)
}

// ReadAt is when the view's last full report was taken.
func (v *View) ReadAt() time.Time {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.readAt
}
