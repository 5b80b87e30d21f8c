// Package provisiontest holds an in-memory LVM for the provision and driver
// tests: state, not a script of calls.
package provisiontest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
)

// LVM is an in-memory provision.LVM and provision.QuarantineLVM. Tests
// hold Mu to touch its fields.
type LVM struct {
	Mu    sync.Mutex
	VGs   map[string]*lvm.VolumeGroup
	LVs   map[string]*lvm.LogicalVolume // key vg/name
	Pools map[string]*lvm.ThinPool      // key vg/name
	// Reports and Gets count the calls of Report and GetLV.
	Reports, Gets int
	uuids         int
	// Activations, Deactivations and Removals list the LVs (vg/name)
	// switched or removed.
	Activations, Deactivations, Removals []string
	// FailNext, when set, is returned by the next mutation.
	FailNext error
	// Unreadable fails every read of a VG, as damaged metadata does.
	Unreadable map[string]error
	// Hidden holds the VGs whose disks are gone, until ShowVG.
	Hidden map[string]*HiddenVG
	// OnCreate, when set, is called with each CreateLV request first.
	OnCreate func(lvm.CreateRequest)
}

// HiddenVG is a volume group HideVG took away, as it was.
type HiddenVG struct {
	vg    *lvm.VolumeGroup
	lvs   map[string]*lvm.LogicalVolume
	pools map[string]*lvm.ThinPool
}

// HideVG hides a VG, as when its disks are missing.
func (f *LVM) HideVG(name string) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	h := &HiddenVG{vg: f.VGs[name], lvs: map[string]*lvm.LogicalVolume{}, pools: map[string]*lvm.ThinPool{}}
	for k, lv := range f.LVs {
		if lv.VolumeGroup == name {
			h.lvs[k] = lv
			delete(f.LVs, k)
		}
	}
	for k, p := range f.Pools {
		if p.VolumeGroup == name {
			h.pools[k] = p
			delete(f.Pools, k)
		}
	}
	delete(f.VGs, name)
	if f.Hidden == nil {
		f.Hidden = map[string]*HiddenVG{}
	}
	f.Hidden[name] = h
}

// ShowVG brings back a VG HideVG took away.
func (f *LVM) ShowVG(name string) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	h := f.Hidden[name]
	f.VGs[name] = h.vg
	for k, lv := range h.lvs {
		f.LVs[k] = lv
	}
	for k, p := range h.pools {
		f.Pools[k] = p
	}
	delete(f.Hidden, name)
}

// vgErrLocked is the error LVM gives for a missing or unreadable vg.
func (f *LVM) vgErrLocked(vg string) error {
	if err := f.Unreadable[vg]; err != nil {
		return err
	}
	if _, ok := f.VGs[vg]; !ok {
		return fmt.Errorf("%s: %w", vg, lvm.ErrVolumeGroupNotFound)
	}
	return nil
}

// Classes is the shared device-class file: fast (thick, default) and thin
// on vg1, other on vg2.
const Classes = `
deviceClasses:
  - name: fast
    volumeGroup: vg1
    default: true
    spare: 1Gi
  - name: thin
    volumeGroup: vg1
    thinPool: pool
    overprovisionRatio: 2
  - name: other
    volumeGroup: vg2
`

// NewLVM is an LVM without volume groups.
func NewLVM() *LVM {
	return &LVM{VGs: map[string]*lvm.VolumeGroup{}, LVs: map[string]*lvm.LogicalVolume{}, Pools: map[string]*lvm.ThinPool{}}
}

const fakeExtent = 4 << 20

// SetReport replaces the whole state with what r reports, as it is: the
// VGs, LVs and thin pools of a hand-written report, whose sizes need not
// add up. A thin pool r lists without its LV gets none.
func (f *LVM) SetReport(r lvm.Report) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.VGs, f.LVs, f.Pools = map[string]*lvm.VolumeGroup{}, map[string]*lvm.LogicalVolume{}, map[string]*lvm.ThinPool{}
	for _, vg := range r.VolumeGroups {
		vg.PhysicalVolumes = slices.Clone(vg.PhysicalVolumes)
		f.VGs[vg.Name] = &vg
	}
	for _, lv := range r.LogicalVolumes {
		lv.Tags = slices.Clone(lv.Tags)
		f.LVs[lv.VolumeGroup+"/"+lv.Name] = &lv
	}
	for _, p := range r.ThinPools {
		f.Pools[p.VolumeGroup+"/"+p.Name] = &p
	}
}

// PVOf is the device of the one PV of a fake volume group.
func PVOf(vg string) string { return "/dev/fake-pv-of-" + vg }

// AddVG adds a volume group of size bytes with 4 MiB extents on one PV.
func (f *LVM) AddVG(name string, size uint64) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.VGs[name] = &lvm.VolumeGroup{Name: name, Size: size, Free: size, ExtentSize: fakeExtent,
		ExtentCount: size / fakeExtent, FreeExtents: size / fakeExtent, PhysicalVolumes: []string{PVOf(name)}}
}

// AddThinPool carves a thin pool of size bytes out of vg.
func (f *LVM) AddThinPool(vg, name string, size uint64) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.VGs[vg].Free -= size
	f.VGs[vg].FreeExtents = f.VGs[vg].Free / fakeExtent
	f.Pools[vg+"/"+name] = &lvm.ThinPool{Name: name, VolumeGroup: vg, Size: size}
	f.LVs[vg+"/"+name] = &lvm.LogicalVolume{Name: name, VolumeGroup: vg, Size: size,
		Attr: lvm.Attributes{Type: lvm.TypeThinPool, Active: true, Health: lvm.HealthOK}}
}

func roundUp(size uint64) uint64 {
	if size == 0 {
		return fakeExtent
	}
	return (size + fakeExtent - 1) / fakeExtent * fakeExtent
}

// Report answers as the lvm package does: lvm.ErrVolumeGroupNotFound
// for the one named VG missing, else one error naming every named VG that
// failed, as fullreport's exit code 5 does.
func (f *LVM) Report(ctx context.Context, vgs ...string) (*lvm.Report, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.Reports++
	var errs []error
	for _, vg := range vgs {
		err := f.vgErrLocked(vg)
		switch {
		case err == nil:
			continue
		case len(vgs) == 1:
			return nil, err
		case errors.Is(err, lvm.ErrVolumeGroupNotFound):
			err = fmt.Errorf("volume group %s not found", vg)
		}
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("fullreport: exit code 5: %w", errors.Join(errs...))
	}
	named := func(vg string) bool { return len(vgs) == 0 || slices.Contains(vgs, vg) }
	r := &lvm.Report{ReadAt: time.Now()}
	for _, vg := range f.VGs {
		if named(vg.Name) {
			r.VolumeGroups = append(r.VolumeGroups, *vg)
		}
	}
	for _, lv := range f.LVs {
		if named(lv.VolumeGroup) {
			r.LogicalVolumes = append(r.LogicalVolumes, *lv)
		}
	}
	for _, p := range f.Pools {
		if named(p.VolumeGroup) {
			r.ThinPools = append(r.ThinPools, *p)
		}
	}
	slices.SortFunc(r.VolumeGroups, func(a, b lvm.VolumeGroup) int { return compare(a.Name, b.Name) })
	slices.SortFunc(r.LogicalVolumes, func(a, b lvm.LogicalVolume) int { return compare(a.Name, b.Name) })
	return r, nil
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (f *LVM) GetLV(ctx context.Context, vg, name string) (*lvm.LogicalVolume, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	f.Gets++
	if err := f.vgErrLocked(vg); err != nil {
		return nil, err
	}
	lv, err := f.lvLocked(vg, name)
	if err != nil {
		return nil, err
	}
	c := *lv
	return &c, nil
}

// lvLocked wraps lvm.ErrNotFound as lvm does; f.mu is held.
func (f *LVM) lvLocked(vg, name string) (*lvm.LogicalVolume, error) {
	lv, ok := f.LVs[vg+"/"+name]
	if !ok {
		return nil, fmt.Errorf("lv %s/%s: %w", vg, name, lvm.ErrNotFound)
	}
	return lv, nil
}

func (f *LVM) takeFailure() error {
	err := f.FailNext
	f.FailNext = nil
	return err
}

// refusal is why a change in vg fails before it starts: the failure set
// for the next call, or vg hidden; f.mu is held.
func (f *LVM) refusal(vg string) error {
	if err := f.takeFailure(); err != nil {
		return err
	}
	return f.vgErrLocked(vg)
}

// changeableLV is the LV a change is asked of: the failure set for the
// next call, else lvLocked's answer; f.mu is held.
func (f *LVM) changeableLV(vg, name string) (*lvm.LogicalVolume, error) {
	if err := f.takeFailure(); err != nil {
		return nil, err
	}
	return f.lvLocked(vg, name)
}

func (f *LVM) CreateLV(ctx context.Context, req lvm.CreateRequest) (*lvm.LogicalVolume, error) {
	if f.OnCreate != nil {
		f.OnCreate(req)
	}
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return nil, err
	}
	vg, ok := f.VGs[req.VolumeGroup]
	if !ok {
		return nil, fmt.Errorf("vg %s: %w", req.VolumeGroup, lvm.ErrNotFound)
	}
	key := req.VolumeGroup + "/" + req.Name
	if _, ok := f.LVs[key]; ok {
		return nil, fmt.Errorf("lv %s: %w", key, lvm.ErrAlreadyExists)
	}
	size := roundUp(req.Size)
	lv := &lvm.LogicalVolume{Name: req.Name, VolumeGroup: req.VolumeGroup, Size: size,
		Tags: slices.Clone(req.Tags), Path: "/dev/" + key,
		Attr: lvm.Attributes{Type: lvm.TypeThick, Active: true, Health: lvm.HealthOK}}
	if req.ThinPool != "" {
		pool, ok := f.Pools[req.VolumeGroup+"/"+req.ThinPool]
		if !ok {
			return nil, fmt.Errorf("thin pool %s: %w", req.ThinPool, lvm.ErrNotFound)
		}
		pool.VirtualSize += size
		pool.ThinVolumes++
		lv.Pool = req.ThinPool
		lv.Attr.Type = lvm.TypeThin
	} else {
		if size > vg.Free {
			return nil, fmt.Errorf("vg %s has %d bytes free, %d asked: %w", vg.Name, vg.Free, size, lvm.ErrInsufficientSpace)
		}
		vg.Free -= size
		vg.FreeExtents = vg.Free / fakeExtent
	}
	f.uuids++
	lv.UUID = fmt.Sprintf("%06d-fake-uuid-0000-0000-0000-000000", f.uuids)
	f.LVs[key] = lv
	c := *lv
	c.UUID = ""
	return &c, nil
}

func (f *LVM) ExtendLV(ctx context.Context, vg, name string, size uint64) (*lvm.LogicalVolume, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	lv, err := f.changeableLV(vg, name)
	if err != nil {
		return nil, err
	}
	size = roundUp(size)
	if size > lv.Size {
		grow := size - lv.Size
		if lv.Pool != "" {
			f.Pools[vg+"/"+lv.Pool].VirtualSize += grow
		} else {
			if grow > f.VGs[vg].Free {
				return nil, fmt.Errorf("vg %s: %w", vg, lvm.ErrInsufficientSpace)
			}
			f.VGs[vg].Free -= grow
			f.VGs[vg].FreeExtents = f.VGs[vg].Free / fakeExtent
		}
		lv.Size = size
	}
	c := *lv
	return &c, nil
}

func (f *LVM) RemoveLV(ctx context.Context, vg, name string) error {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if err := f.refusal(vg); err != nil {
		return err
	}
	key := vg + "/" + name
	lv, ok := f.LVs[key]
	if !ok {
		return fmt.Errorf("lv %s: %w", key, lvm.ErrNotFound)
	}
	if lv.Attr.Open {
		return fmt.Errorf("lv %s is open: %w", key, lvm.ErrInUse)
	}
	if lv.Pool != "" {
		p := f.Pools[vg+"/"+lv.Pool]
		p.VirtualSize -= lv.Size
		p.ThinVolumes--
	} else {
		f.VGs[vg].Free += lv.Size
		f.VGs[vg].FreeExtents = f.VGs[vg].Free / fakeExtent
		// lvremove --yes takes a thick origin's snapshots with it.
		for k, s := range f.LVs {
			if s.VolumeGroup == vg && s.Origin == name && s.Attr.Type == lvm.TypeSnapshot {
				f.VGs[vg].Free += s.Size
				delete(f.LVs, k)
			}
		}
		f.VGs[vg].FreeExtents = f.VGs[vg].Free / fakeExtent
	}
	delete(f.LVs, key)
	f.Removals = append(f.Removals, key)
	return nil
}

// RenameLV renames an LV as lvrename does: lvm.ErrNotFound when it does
// not exist, lvm.ErrAlreadyExists when the new name is taken.
func (f *LVM) RenameLV(ctx context.Context, vg, name, newName string) error {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	lv, err := f.changeableLV(vg, name)
	if err != nil {
		return err
	}
	if _, ok := f.LVs[vg+"/"+newName]; ok {
		return fmt.Errorf("lv %s/%s: %w", vg, newName, lvm.ErrAlreadyExists)
	}
	delete(f.LVs, vg+"/"+name)
	lv.Name, lv.Path = newName, "/dev/"+vg+"/"+newName
	f.LVs[vg+"/"+newName] = lv
	return nil
}

// DeleteTags implements provision.LVM.
func (f *LVM) DeleteTags(ctx context.Context, vg, name string, tags ...string) error {
	return f.ChangeTags(ctx, vg, name, nil, tags)
}

// ChangeTags implements provision.TagLVM.
func (f *LVM) ChangeTags(ctx context.Context, vg, name string, add, del []string) error {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if err := f.refusal(vg); err != nil {
		return err
	}
	lv, err := f.lvLocked(vg, name)
	if err != nil {
		return err
	}
	tags := slices.DeleteFunc(slices.Clone(lv.Tags), func(t string) bool { return slices.Contains(del, t) })
	for _, t := range add {
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	lv.Tags = tags
	return nil
}

// DeactivateLV implements provision.LVM; an open LV fails as lvchange
// does, with no lvm error class.
func (f *LVM) DeactivateLV(ctx context.Context, vg, name string) error {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	lv, err := f.changeableLV(vg, name)
	if err != nil {
		return err
	}
	if lv.Attr.Open && lv.Attr.Active {
		return fmt.Errorf("lvchange: logical volume %s/%s in use", vg, name)
	}
	if lv.Attr.Active {
		lv.Attr.Active = false
		f.Deactivations = append(f.Deactivations, vg+"/"+name)
	}
	return nil
}

// ActivateLV activates a thin LV's pool with it, whatever activation-skip.
func (f *LVM) ActivateLV(ctx context.Context, vg, name string) (*lvm.LogicalVolume, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	lv, err := f.changeableLV(vg, name)
	if err != nil {
		return nil, err
	}
	if !lv.Attr.Active {
		lv.Attr.Active = true
		f.Activations = append(f.Activations, vg+"/"+name)
		if pool, ok := f.LVs[vg+"/"+lv.Pool]; ok && lv.Pool != "" {
			pool.Attr.Active = true
		}
	}
	c := *lv
	return &c, nil
}

// CreateSnapshot makes a thin or copy-on-write snapshot as lvm does.
func (f *LVM) CreateSnapshot(ctx context.Context, req lvm.SnapshotRequest) (*lvm.LogicalVolume, error) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return nil, err
	}
	if err := f.vgErrLocked(req.VolumeGroup); err != nil {
		return nil, err
	}
	o, ok := f.LVs[req.VolumeGroup+"/"+req.Origin]
	if !ok {
		return nil, fmt.Errorf("origin %s: %w", req.Origin, lvm.ErrNotFound)
	}
	key := req.VolumeGroup + "/" + req.Name
	if _, ok := f.LVs[key]; ok {
		return nil, fmt.Errorf("lv %s: %w", key, lvm.ErrAlreadyExists)
	}
	lv := &lvm.LogicalVolume{Name: req.Name, VolumeGroup: req.VolumeGroup, Size: o.Size, Tags: slices.Clone(req.Tags),
		Origin: req.Origin, Path: "/dev/" + key, Time: time.Now().Truncate(time.Second)}
	if req.CowSize == 0 {
		if o.Attr.Type != lvm.TypeThin {
			return nil, fmt.Errorf("origin %s is not thin: %w", req.Origin, lvm.ErrInvalidArgument)
		}
		lv.Pool = o.Pool
		lv.Attr = lvm.Attributes{Type: lvm.TypeThin, Active: !req.ActivationSkip, Health: lvm.HealthOK, ActivationSkip: req.ActivationSkip}
		p := f.Pools[req.VolumeGroup+"/"+o.Pool]
		p.VirtualSize += lv.Size
		p.ThinVolumes++
	} else {
		if o.Attr.Type != lvm.TypeThick {
			return nil, fmt.Errorf("origin %s is not thick: %w", req.Origin, lvm.ErrInvalidArgument)
		}
		size := roundUp(req.CowSize)
		vg := f.VGs[req.VolumeGroup]
		if size > vg.Free {
			return nil, fmt.Errorf("vg %s has %d bytes free, %d asked: %w", vg.Name, vg.Free, size, lvm.ErrInsufficientSpace)
		}
		vg.Free -= size
		vg.FreeExtents = vg.Free / fakeExtent
		lv.Size = size
		lv.Attr = lvm.Attributes{Type: lvm.TypeSnapshot, Active: o.Attr.Active, Health: lvm.HealthOK}
	}
	f.LVs[key] = lv
	c := *lv
	return &c, nil
}

// LVTags is the tags of an LV, and whether it exists.
func (f *LVM) LVTags(vg, name string) ([]string, bool) {
	f.Mu.Lock()
	defer f.Mu.Unlock()
	lv, ok := f.LVs[vg+"/"+name]
	if !ok {
		return nil, false
	}
	return slices.Clone(lv.Tags), true
}
