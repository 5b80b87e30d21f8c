// Package vgview keeps the in-memory view of this node's volume groups that
// GetCapacity, ListVolumes and CreateVolume read instead of running LVM per
// call. Mutations apply their result at once, a full refresh follows, and a
// periodic refresh catches changes made outside carve.
package vgview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// Reporter reads LVM state with one command; *lvm.Client implements it.
type Reporter interface {
	// Report reads the named VGs (all when none).
	Report(ctx context.Context, vgs ...string) (*lvm.Report, error)
}

// ErrClassUnavailable: the class's VG or pool is missing, the VG has a
// missing PV or cannot be read, or the pool is failed or read-only.
var ErrClassUnavailable = errors.New("device class unavailable")

// View is the in-memory view. It is safe for concurrent use.
type View struct {
	reporter Reporter
	cfg      *deviceclass.Config
	rec      *metrics.Recorder

	mu    sync.RWMutex
	vgs   map[string]lvm.VolumeGroup
	lvs   map[string]lvm.LogicalVolume // key vg/name
	pools map[string]lvm.ThinPool      // key vg/name
	// unreadable VGs keep their last state; their classes are unavailable.
	unreadable map[string]error
	readAt     time.Time
	lastErr    error
	loaded     bool
	// lastRead counts discarded reports too; staleAfter bounds its age.
	lastRead   time.Time
	staleAfter time.Duration
	now        func() time.Time
	// gen counts local mutations; a refresh that started before one is redone.
	gen        uint64
	runTimeout time.Duration

	dirty chan struct{}
	// room serializes room checks with the mutations that take room: two
	// requests that each fit alone must not both pass and eat into the spare.
	// Waiting honours the context, so a hung lvm holds no caller past its
	// deadline.
	room    lvm.VGLocks
	changes signal
}

// New returns an empty view; call Refresh before using it.
func New(r Reporter, cfg *deviceclass.Config, rec *metrics.Recorder) *View {
	v := &View{reporter: r, cfg: cfg, rec: rec,
		vgs: map[string]lvm.VolumeGroup{}, lvs: map[string]lvm.LogicalVolume{}, pools: map[string]lvm.ThinPool{},
		dirty: make(chan struct{}, 1), now: time.Now, runTimeout: 2 * time.Minute}
	// Every class has its availability series from the start.
	v.publishLocked()
	return v
}

// StaleAfter makes Ready fail once no report came back for d: a hung lvm (a
// disk in D state) never ends a refresh with an error, and an old view may
// advertise space that is gone. 0 turns the check off.
func (v *View) StaleAfter(d time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.staleAfter = d
}

// Refresh reads the configured VGs and replaces the view. A missing VG
// leaves it; an unreadable one keeps its last state and makes its classes
// unavailable. Refresh fails only when ctx ended (view kept), which Ready
// ignores: a caller that gave up says nothing about LVM.
func (v *View) Refresh(ctx context.Context) error {
	v.mu.RLock()
	gen := v.gen
	v.mu.RUnlock()
	r, unreadable, err := v.read(ctx, v.configuredVGs())
	if err != nil {
		v.changes.fire()
		return fmt.Errorf("read LVM state: %w", err)
	}
	now := time.Now()
	var vgErrs []error
	for vg, e := range unreadable {
		vgErrs = append(vgErrs, fmt.Errorf("volume group %s: %w", vg, e))
		klog.FromContext(ctx).Error(e, "Reading a volume group failed; its device classes are unavailable", "volumeGroup", vg)
	}
	v.rec.ObserveRefresh(now, errors.Join(vgErrs...))
	defer v.changes.fire()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.lastErr = nil
	v.lastRead = v.now()
	if v.gen != gen {
		// A mutation raced the report: keep the local state, refresh again soon.
		v.markDirtyLocked()
		v.publishLocked() // an earlier failure is over
		return nil
	}
	vgs := make(map[string]lvm.VolumeGroup, len(r.VolumeGroups))
	for _, vg := range r.VolumeGroups {
		vgs[vg.Name] = vg
	}
	lvs := make(map[string]lvm.LogicalVolume, len(r.LogicalVolumes))
	for _, lv := range r.LogicalVolumes {
		lvs[lv.VolumeGroup+"/"+lv.Name] = lv
	}
	pools := make(map[string]lvm.ThinPool, len(r.ThinPools))
	for _, p := range r.ThinPools {
		pools[p.VolumeGroup+"/"+p.Name] = p
	}
	// Unreadable VGs keep their last state, so DeleteVolume still refuses to
	// take their volumes for gone.
	for vg := range unreadable {
		if old, ok := v.vgs[vg]; ok {
			vgs[vg] = old
		}
		for k, lv := range v.lvs {
			if lv.VolumeGroup == vg {
				lvs[k] = lv
			}
		}
		for k, p := range v.pools {
			if p.VolumeGroup == vg {
				pools[k] = p
			}
		}
	}
	v.vgs, v.lvs, v.pools, v.unreadable = vgs, lvs, pools, unreadable
	v.readAt = r.ReadAt
	v.loaded = true
	v.publishLocked()
	return nil
}

// read reads vgs with one report, else one by one, so an unreadable VG (a
// broken disk, damaged metadata) takes down only its classes. unreadable
// has the error of each VG that exists but could not be read. err is set
// only when ctx ended.
func (v *View) read(ctx context.Context, vgs []string) (r *lvm.Report, unreadable map[string]error, err error) {
	start := time.Now()
	if len(vgs) == 0 {
		return &lvm.Report{ReadAt: start}, nil, nil
	}
	all, err := v.reporter.Report(ctx, vgs...)
	if err == nil {
		return all, nil, nil
	}
	if ctx.Err() != nil {
		return nil, nil, err
	}
	r = &lvm.Report{ReadAt: start}
	for _, vg := range vgs {
		one, err := all, err
		if len(vgs) > 1 {
			one, err = v.reporter.Report(ctx, vg)
		}
		switch {
		case err == nil:
			r.VolumeGroups = append(r.VolumeGroups, one.VolumeGroups...)
			r.LogicalVolumes = append(r.LogicalVolumes, one.LogicalVolumes...)
			r.ThinPools = append(r.ThinPools, one.ThinPools...)
		case ctx.Err() != nil:
			return nil, nil, err
		case errors.Is(err, lvm.ErrVolumeGroupNotFound):
		default:
			if unreadable == nil {
				unreadable = map[string]error{}
			}
			unreadable[vg] = err
		}
	}
	return r, unreadable, nil
}

// Run refreshes periodically and after mutations until ctx ends.
func (v *View) Run(ctx context.Context, interval, settle time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-v.dirty:
			select {
			case <-ctx.Done():
				return
			case <-time.After(settle):
			}
			select {
			case <-v.dirty:
			default:
			}
		}
		rctx, cancel := context.WithTimeout(ctx, v.runTimeout)
		if err := v.Refresh(rctx); err != nil {
			klog.ErrorS(err, "Refreshing the volume-group view failed")
			if ctx.Err() == nil {
				// The view's own deadline: LVM did not answer in time, which Ready shows.
				v.fail(err)
			}
		}
		cancel()
	}
}

// fail records err for Ready and Serving until a refresh succeeds.
func (v *View) fail(err error) {
	v.rec.ObserveRefresh(time.Now(), err)
	reason := ReasonLVMError
	if errors.Is(err, context.DeadlineExceeded) {
		reason = ReasonLVMTimeout
	}
	v.mu.Lock()
	v.lastErr = notReady(reason, err)
	v.publishLocked()
	v.mu.Unlock()
	v.changes.fire()
}

func (v *View) markDirtyLocked() {
	select {
	case v.dirty <- struct{}{}:
	default:
	}
}

// Ready is nil when the last refresh succeeded and every class can take
// volumes; otherwise one line per class. An unavailable class does not stop
// the others.
func (v *View) Ready() error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if err := v.loadedLocked(); err != nil {
		return err
	}
	if age := v.now().Sub(v.lastRead); v.staleAfter > 0 && age > v.staleAfter {
		return notReady(ReasonLVMTimeout, fmt.Errorf("the volume-group view is %s old (no LVM report has come back since %s; the limit is %s): lvm may hang on a failing disk",
			age.Round(time.Second), v.lastRead.UTC().Format(time.RFC3339), v.staleAfter))
	}
	var errs []error
	for i := range v.cfg.DeviceClasses {
		if err := v.classProblemLocked(&v.cfg.DeviceClasses[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Serving is nil once a VG was read and the last refresh succeeded.
func (v *View) Serving() error {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if err := v.loadedLocked(); err != nil {
		return err
	}
	if vgs := v.configuredVGs(); len(vgs) > 0 && len(v.unreadable) == len(vgs) {
		var errs []error
		for _, vg := range vgs {
			errs = append(errs, fmt.Errorf("volume group %s: %w", vg, v.unreadable[vg]))
		}
		return fmt.Errorf("LVM cannot read any of this node's volume groups: %w", errors.Join(errs...))
	}
	return nil
}

func (v *View) loadedLocked() error {
	if v.lastErr != nil {
		return v.lastErr
	}
	if !v.loaded {
		return notReady(ReasonNotLoaded, errors.New("volume-group view not loaded yet"))
	}
	return nil
}

// unusablePool: LVM cannot give a new thin volume blocks in these states.
var unusablePool = []lvm.Health{lvm.HealthFailed, lvm.HealthMetadataReadOnly, lvm.HealthPartial}

func (v *View) classProblemLocked(d *deviceclass.DeviceClass) error {
	fail := func(reason, format string, args ...any) error {
		return notReady(reason, fmt.Errorf("device class %s: %s: %w", d.Name, fmt.Sprintf(format, args...), ErrClassUnavailable))
	}
	if err, ok := v.unreadable[d.VolumeGroup]; ok {
		return fail(ReasonVGUnreadable, "volume group %q could not be read: %v", d.VolumeGroup, err)
	}
	vg, ok := v.vgs[d.VolumeGroup]
	if !ok {
		return fail(ReasonVGMissing, "volume group %q is missing", d.VolumeGroup)
	}
	if vg.MissingPVs > 0 {
		// LVM refuses to allocate in a partial VG: its free space is not free.
		return fail(ReasonPVMissing, "volume group %q has %d missing physical volume(s)", d.VolumeGroup, vg.MissingPVs)
	}
	if d.Thin() {
		if _, ok := v.pools[d.VolumeGroup+"/"+d.ThinPool]; !ok {
			return fail(ReasonThinPoolMissing, "thin pool %s/%s is missing", d.VolumeGroup, d.ThinPool)
		}
		if lv, ok := v.lvs[d.VolumeGroup+"/"+d.ThinPool]; ok && slices.Contains(unusablePool, lv.Attr.Health) {
			return fail(ReasonThinPoolUnusable, "thin pool %s/%s is %s (lv_attr %s)", d.VolumeGroup, d.ThinPool, lv.Attr.Health, lv.Attr.Raw)
		}
	}
	return nil
}

// Capacity is class d's room; ErrClassUnavailable with the reason.
func (v *View) Capacity(d *deviceclass.DeviceClass) (Capacity, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.capacityLocked(d)
}

func (v *View) capacityLocked(d *deviceclass.DeviceClass) (Capacity, error) {
	if err := v.classProblemLocked(d); err != nil {
		return Capacity{}, err
	}
	vg := v.vgs[d.VolumeGroup]
	if d.Thin() {
		return limitByMetadata(ThinCapacity(d, vg, v.pools[d.VolumeGroup+"/"+d.ThinPool]), vg), nil
	}
	return limitByMetadata(ThickCapacity(d, vg), vg), nil
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

// Changed asks for a refresh soon.
func (v *View) Changed() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen++
	v.markDirtyLocked()
}

// Volumes lists carve's volumes, sorted by "vg/name".
func (v *View) Volumes() []lvm.LogicalVolume { return v.owned(volume.KindVolume) }

// Snapshots lists carve's snapshots, sorted by "vg/name".
func (v *View) Snapshots() []lvm.LogicalVolume { return v.owned(volume.KindSnapshot) }

func (v *View) owned(kind volume.Kind) []lvm.LogicalVolume {
	v.mu.RLock()
	defer v.mu.RUnlock()
	vgs := v.configuredVGs()
	var out []lvm.LogicalVolume
	for _, lv := range v.lvs {
		if !slices.Contains(vgs, lv.VolumeGroup) {
			continue
		}
		if k, _, ok := volume.Owned(lv.Tags); ok && k == kind {
			out = append(out, lv)
		}
	}
	slices.SortFunc(out, func(a, b lvm.LogicalVolume) int {
		return strings.Compare(a.VolumeGroup+"/"+a.Name, b.VolumeGroup+"/"+b.Name)
	})
	return out
}

func (v *View) configuredVGs() []string { return v.cfg.VolumeGroups() }

// Created applies a new LV and asks for a refresh (mirrors use more).
func (v *View) Created(lv lvm.LogicalVolume) {
	defer v.changes.fire()
	v.mu.Lock()
	defer v.mu.Unlock()
	key := lv.VolumeGroup + "/" + lv.Name
	if _, had := v.lvs[key]; had {
		// An older report must not put the old LV back.
		v.lvs[key] = lv
		v.gen++
		v.markDirtyLocked()
		return
	}
	v.lvs[key] = lv
	v.applyLocked(lv, +1)
}

// Removed applies a removal and asks for a refresh soon.
func (v *View) Removed(vg, name string) {
	defer v.changes.fire()
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

func (v *View) applyLocked(lv lvm.LogicalVolume, sign int) {
	v.gen++
	if lv.Pool != "" {
		pkey := lv.VolumeGroup + "/" + lv.Pool
		if p, ok := v.pools[pkey]; ok {
			if sign > 0 {
				p.VirtualSize += lv.Size
				if lv.Name != "" {
					p.ThinVolumes++
				}
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
	// Every LV adds metadata text: count it until the next report.
	if vg, ok := v.vgs[lv.VolumeGroup]; ok && vg.MetadataAreaSize > 0 {
		if sign > 0 {
			vg.MetadataAreaFree = sub(vg.MetadataAreaFree, lvm.LVMetadataBytes)
		} else {
			vg.MetadataAreaFree = min(vg.MetadataAreaSize, vg.MetadataAreaFree+lvm.LVMetadataBytes)
		}
		v.vgs[lv.VolumeGroup] = vg
	}
	v.publishLocked()
	v.markDirtyLocked()
}

func (v *View) publishLocked() {
	if v.rec == nil {
		return
	}
	counts := map[string]int{}
	for _, lv := range v.lvs {
		// A quarantined orphan is no volume; the controller counts it.
		if k, class, ok := volume.Owned(lv.Tags); ok && k == volume.KindVolume && !volume.IsQuarantineName(lv.Name) {
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
			VGSize: vg.Size, VGFree: vg.Free, Volumes: counts[d.VolumeGroup+"/"+d.Name],
			MetadataAreaSize: vg.MetadataAreaSize, MetadataAreaFree: vg.MetadataAreaFree}
		if c, err := v.capacityLocked(d); err == nil {
			s.AvailableCapacity = c.Available
		}
		if d.Thin() {
			p := v.pools[d.VolumeGroup+"/"+d.ThinPool]
			s.ThinPool = d.ThinPool
			s.ThinDataPercent, s.ThinMetaPercent = p.DataPercent, p.MetadataPercent
			s.ThinZeroing = p.ZeroNewBlocks
		}
		states = append(states, s)
	}
	v.rec.SetClassStates(states)
	v.rec.SetSnapshotStates(v.snapshotStatesLocked())
	v.rec.SetClassAvailability(v.availabilityLocked())
}

// availabilityLocked: a failed or missing refresh fails every class.
func (v *View) availabilityLocked() []metrics.ClassAvailability {
	out := make([]metrics.ClassAvailability, 0, len(v.cfg.DeviceClasses))
	for i := range v.cfg.DeviceClasses {
		d := &v.cfg.DeviceClasses[i]
		a := metrics.ClassAvailability{DeviceClass: d.Name, VolumeGroup: d.VolumeGroup}
		err := v.loadedLocked()
		if err == nil {
			err = v.classProblemLocked(d)
		}
		vg := v.vgs[d.VolumeGroup]
		switch reasons := Reasons(err); {
		case len(reasons) > 0:
			a.Reason = reasons[0]
		case vg.MetadataFull():
			a.Reason = ReasonMetadataFull
		}
		out = append(out, a)
	}
	return out
}

// snapshotStatesLocked: copy-on-write snapshots' fill and overflow.
func (v *View) snapshotStatesLocked() []metrics.SnapshotState {
	vgs := v.configuredVGs()
	var out []metrics.SnapshotState
	for _, lv := range v.lvs {
		if lv.Attr.Type != lvm.TypeSnapshot || !slices.Contains(vgs, lv.VolumeGroup) {
			continue
		}
		k, class, ok := volume.Owned(lv.Tags)
		if !ok || k != volume.KindSnapshot {
			continue
		}
		used := clampPercent(lv.SnapPercent)
		out = append(out, metrics.SnapshotState{DeviceClass: class, VolumeGroup: lv.VolumeGroup, Snapshot: lv.Name,
			COWUsedRatio: used / 100, Invalid: lv.Attr.SnapshotInvalid || used >= 100})
	}
	return out
}

// UnzeroedThinClasses lists thin classes whose pool does not zero new
// blocks: new volumes can read what removed ones wrote.
func (v *View) UnzeroedThinClasses() []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var names []string
	for i := range v.cfg.DeviceClasses {
		d := &v.cfg.DeviceClasses[i]
		if p, ok := v.pools[d.VolumeGroup+"/"+d.ThinPool]; d.Thin() && ok && !p.ZeroNewBlocks {
			names = append(names, d.Name)
		}
	}
	return names
}

// Readable: the view holds a fresh read of vg; absent LVs are gone.
func (v *View) Readable(vg string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if !v.loaded || v.lastErr != nil || !slices.Contains(v.configuredVGs(), vg) {
		return false
	}
	_, bad := v.unreadable[vg]
	return !bad
}

// PhysicalVolumes are vg's found PVs as last read; nil without vg.
func (v *View) PhysicalVolumes(vg string) []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return slices.Clone(v.vgs[vg].PhysicalVolumes)
}

// ReadAt is when the view's last full report was taken.
func (v *View) ReadAt() time.Time {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.readAt
}
