// Package vgview keeps carve's in-memory view of this node's volume groups
// (free space, thin pools, carve's LVs), which GetCapacity, ListVolumes and
// CreateVolume's repeat lookup read instead of running LVM per call. Each
// mutation applies its result at once, a full refresh follows shortly, and a
// periodic refresh catches changes made outside carve; Changes wakes the
// capacity stream after each.
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
	// Report reads the named volume groups (every one when none is
	// named). A report of one volume group that does not exist fails with
	// lvm.ErrVolumeGroupNotFound.
	Report(ctx context.Context, vgs ...string) (*lvm.Report, error)
}

// ErrClassUnavailable is returned for a class that cannot take volumes on
// this node now: its volume group or thin pool is missing from the last
// refresh, the volume group has a missing physical volume, LVM could not
// read the volume group, or the pool is failed or read-only.
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
	// unreadable holds the configured volume groups whose last read
	// failed, with the error; their last known state stays in the maps
	// above, and their classes are unavailable.
	unreadable map[string]error
	// readAt is when the last successful report was taken, lastErr the
	// last refresh's error.
	readAt  time.Time
	lastErr error
	loaded  bool
	// lastRead is when a report last came back, also one thrown away
	// because a mutation raced it; staleAfter (0: never) is how old it may
	// get before Ready fails; now is the clock (tests replace it).
	lastRead   time.Time
	staleAfter time.Duration
	now        func() time.Time
	// gen counts local mutations; a refresh that started before one is
	// stale and is redone.
	gen uint64
	// runTimeout bounds each of Run's refreshes.
	runTimeout time.Duration

	dirty chan struct{}
	// room serializes room checks with the mutations that take room:
	// two creates (or a create and a growth) that each fit alone must not
	// both pass their check and together eat into the spare. Waiting
	// honours the caller's context, so a hung lvm holding one volume
	// group's lock holds no caller past its deadline, nor those of other
	// volume groups at all.
	room lvm.VGLocks
	// changes wakes the watchers of Changes.
	changes signal
}

// New returns an empty view; call Refresh before using it.
func New(r Reporter, cfg *deviceclass.Config, rec *metrics.Recorder) *View {
	v := &View{reporter: r, cfg: cfg, rec: rec,
		vgs: map[string]lvm.VolumeGroup{}, lvs: map[string]lvm.LogicalVolume{}, pools: map[string]lvm.ThinPool{},
		dirty: make(chan struct{}, 1), now: time.Now, runTimeout: 2 * time.Minute}
	// Every class has its availability series from the start (not
	// loaded yet).
	v.publishLocked()
	return v
}

// StaleAfter makes Ready fail once no report has come back for d: a hung
// lvm (a disk stuck in D state) never ends a refresh with an error, and a
// view that old may advertise space that is gone. Call it before serving;
// 0 (the default) turns the check off.
func (v *View) StaleAfter(d time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.staleAfter = d
}

// Refresh reads the configured volume groups and replaces the view. A group
// that does not exist leaves the view; one LVM cannot read keeps its last
// state and makes its classes unavailable, so that one bad group does not
// take the others down. Refresh fails only when the context ended (the view
// is kept); Ready ignores that error: a caller that gave up says nothing
// about LVM.
func (v *View) Refresh(ctx context.Context) error {
	v.mu.RLock()
	gen := v.gen
	v.mu.RUnlock()
	r, unreadable, err := v.read(ctx, v.configuredVGs())
	if err != nil {
		// Only the context ends a read with an error (see read). The
		// watchers still hear of the attempt, as of every refresh.
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
	// After the view's lock is released (deferred calls run last first).
	defer v.changes.fire()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.lastErr = nil
	v.lastRead = v.now()
	if v.gen != gen {
		// A mutation was applied while the report ran; the report may
		// predate it. Keep the local state and refresh again soon.
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
	// What could not be read is kept as it was last seen: its volumes
	// stay listed and findable, and DeleteVolume still refuses to take
	// them for gone.
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

// read reads the volume groups vgs with one report. When that fails, it
// reads them one by one, so that a volume group LVM cannot read (a broken
// disk, damaged metadata) takes down only the classes that use it. The
// report holds the groups that were read; unreadable has the error of each
// group that exists but could not be read; a group that does not exist is
// in neither. err is set only when the context ended.
func (v *View) read(ctx context.Context, vgs []string) (r *lvm.Report, unreadable map[string]error, err error) {
	start := time.Now()
	if len(vgs) == 0 {
		// No class, nothing to read (and no names would mean every VG).
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
			// Missing: absent from the view.
		default:
			if unreadable == nil {
				unreadable = map[string]error{}
			}
			unreadable[vg] = err
		}
	}
	return r, unreadable, nil
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
			// What marked the view dirty while it settled is covered by
			// the refresh below: one report per burst.
			select {
			case <-v.dirty:
			default:
			}
		}
		rctx, cancel := context.WithTimeout(ctx, v.runTimeout)
		if err := v.Refresh(rctx); err != nil {
			klog.ErrorS(err, "Refreshing the volume-group view failed")
			if ctx.Err() == nil {
				// The view's own deadline, not a shutdown: LVM did not
				// answer in time, which Ready must show.
				v.fail(err)
			}
		}
		cancel()
	}
}

// fail records err as the last refresh's error, which Ready and Serving
// report until a refresh succeeds.
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

// Ready is nil when the last refresh succeeded and every device class can
// take volumes; otherwise it says what is wrong, one line per class. A
// class that is unavailable does not stop the others: Capacity and the
// lookups keep answering for them whatever Ready says.
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

// Serving is nil once the view has been read, its last refresh succeeded
// and LVM could read at least one of the configured volume groups: the
// plugin can answer for the classes it sees, even while others are
// unavailable (Ready says which).
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

// loadedLocked is nil once a refresh has loaded the view and the last one
// succeeded.
func (v *View) loadedLocked() error {
	if v.lastErr != nil {
		return v.lastErr
	}
	if !v.loaded {
		return notReady(ReasonNotLoaded, errors.New("volume-group view not loaded yet"))
	}
	return nil
}

// unusablePool are the thin-pool health states in which LVM cannot give a
// new thin volume its blocks.
var unusablePool = []lvm.Health{lvm.HealthFailed, lvm.HealthMetadataReadOnly, lvm.HealthPartial}

// classProblemLocked says why class d cannot take volumes, wrapping
// ErrClassUnavailable; nil when it can.
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
		// LVM refuses to allocate in a partial VG, so every lvcreate
		// would fail; its free space is not free.
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

// Capacity is the room of class d; ErrClassUnavailable (wrapped, with the
// reason) when the class cannot take volumes now.
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
func (v *View) Volumes() []lvm.LogicalVolume { return v.owned(volume.KindVolume) }

// Snapshots lists carve's snapshots in the configured volume groups,
// sorted by "vg/name".
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

// Created applies an LV that carve just made to the view, and asks for a
// full refresh soon (a mirrored LV uses more than its size, for example).
func (v *View) Created(lv lvm.LogicalVolume) {
	defer v.changes.fire()
	v.mu.Lock()
	defer v.mu.Unlock()
	key := lv.VolumeGroup + "/" + lv.Name
	if _, had := v.lvs[key]; had {
		// A change of its tags, say: a report read before it must not
		// put the old LV back.
		v.lvs[key] = lv
		v.gen++
		v.markDirtyLocked()
		return
	}
	v.lvs[key] = lv
	v.applyLocked(lv, +1)
}

// Removed applies the removal of vg/name to the view and asks for a full
// refresh soon.
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

// applyLocked moves lv's size between free and used.
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
	// Every LV, thin or thick, adds its text to the VG's metadata: count it
	// until the next report says exactly.
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
		// A quarantined orphan is no volume any more; the controller's
		// carve_quarantined_volumes counts it.
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

// availabilityLocked says, for every configured class, whether it can take
// new volumes and, if not, the reason code: a failed refresh (or none yet)
// makes every class unavailable, with that reason.
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

// snapshotStatesLocked is the state of carve's thick (copy-on-write)
// snapshots in the configured volume groups: how full their space is and
// whether they ran out of it (thin snapshots cannot).
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

// UnzeroedThinClasses lists the thin classes whose pool (as last read)
// does not zero new blocks: their new volumes can read what removed ones
// wrote.
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

// Readable tells whether the view holds a fresh read of volume group vg:
// it is configured, the last refresh succeeded, and LVM could read it or
// told that it does not exist. An LV absent from a readable volume group
// is gone.
func (v *View) Readable(vg string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if !v.loaded || v.lastErr != nil || !slices.Contains(v.configuredVGs(), vg) {
		return false
	}
	_, bad := v.unreadable[vg]
	return !bad
}

// PhysicalVolumes are the device paths of the PVs of volume group vg as
// the last refresh read them (a missing PV left out); nil when the view
// does not hold vg.
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
