package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
)

// fakeLVM is an in-memory LVM for unit tests: volume groups with a size and
// an extent size, thick and thin LVs, and the lvm package's errors.
type fakeLVM struct {
	mu      sync.Mutex
	vgs     map[string]*lvm.VolumeGroup
	lvs     map[string]*lvm.LogicalVolume // key vg/name
	pools   map[string]*lvm.ThinPool      // key vg/name
	reports int
	gets    int
	// uuids counts the UUIDs handed out.
	uuids int
	// activations lists the LVs (vg/name) ActivateLV activated,
	// deactivations those DeactivateLV deactivated.
	activations, deactivations []string
	// failNext, when set, is returned by the next mutation.
	failNext error
	// unreadable makes every read of a VG fail with its error, as LVM does
	// for a VG with damaged metadata.
	unreadable map[string]error
	// hidden holds the VGs (with their LVs and pools) whose disks are
	// gone: LVM does not see them until showVG.
	hidden map[string]*hiddenVG
	// onCreate, when set, is called with each CreateLV request first.
	onCreate func(lvm.CreateRequest)
}

type hiddenVG struct {
	vg    *lvm.VolumeGroup
	lvs   map[string]*lvm.LogicalVolume
	pools map[string]*lvm.ThinPool
}

// hideVG makes a VG and everything in it invisible, as when its disks are
// missing; showVG brings it back as it was.
func (f *fakeLVM) hideVG(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := &hiddenVG{vg: f.vgs[name], lvs: map[string]*lvm.LogicalVolume{}, pools: map[string]*lvm.ThinPool{}}
	for k, lv := range f.lvs {
		if lv.VolumeGroup == name {
			h.lvs[k] = lv
			delete(f.lvs, k)
		}
	}
	for k, p := range f.pools {
		if p.VolumeGroup == name {
			h.pools[k] = p
			delete(f.pools, k)
		}
	}
	delete(f.vgs, name)
	if f.hidden == nil {
		f.hidden = map[string]*hiddenVG{}
	}
	f.hidden[name] = h
}

func (f *fakeLVM) showVG(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.hidden[name]
	f.vgs[name] = h.vg
	for k, lv := range h.lvs {
		f.lvs[k] = lv
	}
	for k, p := range h.pools {
		f.pools[k] = p
	}
	delete(f.hidden, name)
}

// vgErrLocked is the error LVM gives for an LV of vg: the VG is missing or
// unreadable; nil when it can be read.
func (f *fakeLVM) vgErrLocked(vg string) error {
	if err := f.unreadable[vg]; err != nil {
		return err
	}
	if _, ok := f.vgs[vg]; !ok {
		return fmt.Errorf("%s: %w", vg, lvm.ErrVolumeGroupNotFound)
	}
	return nil
}

func newFakeLVM() *fakeLVM {
	return &fakeLVM{vgs: map[string]*lvm.VolumeGroup{}, lvs: map[string]*lvm.LogicalVolume{}, pools: map[string]*lvm.ThinPool{}}
}

const fakeExtent = 4 << 20

// pvOf is the device of the one PV of a fake volume group.
func pvOf(vg string) string { return "/dev/fake-pv-of-" + vg }

// addVG adds a volume group of size bytes with 4 MiB extents on one PV.
func (f *fakeLVM) addVG(name string, size uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vgs[name] = &lvm.VolumeGroup{Name: name, Size: size, Free: size, ExtentSize: fakeExtent,
		ExtentCount: size / fakeExtent, FreeExtents: size / fakeExtent, PhysicalVolumes: []string{pvOf(name)}}
}

// addThinPool carves a thin pool of size bytes out of vg.
func (f *fakeLVM) addThinPool(vg, name string, size uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vgs[vg].Free -= size
	f.vgs[vg].FreeExtents = f.vgs[vg].Free / fakeExtent
	f.pools[vg+"/"+name] = &lvm.ThinPool{Name: name, VolumeGroup: vg, Size: size}
	f.lvs[vg+"/"+name] = &lvm.LogicalVolume{Name: name, VolumeGroup: vg, Size: size,
		Attr: lvm.Attributes{Type: lvm.TypeThinPool, Active: true, Health: lvm.HealthOK}}
}

func roundUp(size uint64) uint64 {
	if size == 0 {
		return fakeExtent
	}
	return (size + fakeExtent - 1) / fakeExtent * fakeExtent
}

// Report answers as the lvm package does: the named VGs (all when none
// is named); a named VG that is missing or unreadable fails the report,
// with lvm.ErrVolumeGroupNotFound when it is the only one named and missing.
func (f *fakeLVM) Report(ctx context.Context, vgs ...string) (*lvm.Report, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports++
	for _, vg := range vgs {
		if err := f.vgErrLocked(vg); err != nil {
			if len(vgs) > 1 && errors.Is(err, lvm.ErrVolumeGroupNotFound) {
				err = fmt.Errorf("fullreport: exit code 5: volume group %s not found", vg)
			}
			return nil, err
		}
	}
	named := func(vg string) bool { return len(vgs) == 0 || slices.Contains(vgs, vg) }
	r := &lvm.Report{ReadAt: time.Now()}
	for _, vg := range f.vgs {
		if named(vg.Name) {
			r.VolumeGroups = append(r.VolumeGroups, *vg)
		}
	}
	for _, lv := range f.lvs {
		if named(lv.VolumeGroup) {
			r.LogicalVolumes = append(r.LogicalVolumes, *lv)
		}
	}
	for _, p := range f.pools {
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

func (f *fakeLVM) GetLV(ctx context.Context, vg, name string) (*lvm.LogicalVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
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

// lvLocked is LV vg/name, or an error wrapping lvm.ErrNotFound, as the
// lvm package reports a missing LV; f.mu is held.
func (f *fakeLVM) lvLocked(vg, name string) (*lvm.LogicalVolume, error) {
	lv, ok := f.lvs[vg+"/"+name]
	if !ok {
		return nil, fmt.Errorf("lv %s/%s: %w", vg, name, lvm.ErrNotFound)
	}
	return lv, nil
}

func (f *fakeLVM) takeFailure() error {
	err := f.failNext
	f.failNext = nil
	return err
}

func (f *fakeLVM) CreateLV(ctx context.Context, req lvm.CreateRequest) (*lvm.LogicalVolume, error) {
	if f.onCreate != nil {
		f.onCreate(req)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return nil, err
	}
	vg, ok := f.vgs[req.VolumeGroup]
	if !ok {
		return nil, fmt.Errorf("vg %s: %w", req.VolumeGroup, lvm.ErrNotFound)
	}
	key := req.VolumeGroup + "/" + req.Name
	if _, ok := f.lvs[key]; ok {
		return nil, fmt.Errorf("lv %s: %w", key, lvm.ErrAlreadyExists)
	}
	size := roundUp(req.Size)
	lv := &lvm.LogicalVolume{Name: req.Name, VolumeGroup: req.VolumeGroup, Size: size,
		Tags: slices.Clone(req.Tags), Path: "/dev/" + key,
		Attr: lvm.Attributes{Type: lvm.TypeThick, Active: true, Health: lvm.HealthOK}}
	if req.ThinPool != "" {
		pool, ok := f.pools[req.VolumeGroup+"/"+req.ThinPool]
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
	// LVM gives each LV a UUID, which reports show and CreateLV's
	// result does not.
	f.uuids++
	lv.UUID = fmt.Sprintf("%06d-fake-uuid-0000-0000-0000-000000", f.uuids)
	f.lvs[key] = lv
	c := *lv
	c.UUID = ""
	return &c, nil
}

func (f *fakeLVM) ExtendLV(ctx context.Context, vg, name string, size uint64) (*lvm.LogicalVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return nil, err
	}
	lv, err := f.lvLocked(vg, name)
	if err != nil {
		return nil, err
	}
	size = roundUp(size)
	if size > lv.Size {
		grow := size - lv.Size
		if lv.Pool != "" {
			f.pools[vg+"/"+lv.Pool].VirtualSize += grow
		} else {
			if grow > f.vgs[vg].Free {
				return nil, fmt.Errorf("vg %s: %w", vg, lvm.ErrInsufficientSpace)
			}
			f.vgs[vg].Free -= grow
			f.vgs[vg].FreeExtents = f.vgs[vg].Free / fakeExtent
		}
		lv.Size = size
	}
	c := *lv
	return &c, nil
}

func (f *fakeLVM) RemoveLV(ctx context.Context, vg, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return err
	}
	if err := f.vgErrLocked(vg); err != nil {
		return err
	}
	key := vg + "/" + name
	lv, ok := f.lvs[key]
	if !ok {
		return fmt.Errorf("lv %s: %w", key, lvm.ErrNotFound)
	}
	if lv.Attr.Open {
		return fmt.Errorf("lv %s is open: %w", key, lvm.ErrInUse)
	}
	if lv.Pool != "" {
		p := f.pools[vg+"/"+lv.Pool]
		p.VirtualSize -= lv.Size
		p.ThinVolumes--
	} else {
		f.vgs[vg].Free += lv.Size
		f.vgs[vg].FreeExtents = f.vgs[vg].Free / fakeExtent
		// lvremove --yes takes a thick origin's snapshots with it.
		for k, s := range f.lvs {
			if s.VolumeGroup == vg && s.Origin == name && s.Attr.Type == lvm.TypeSnapshot {
				f.vgs[vg].Free += s.Size
				delete(f.lvs, k)
			}
		}
		f.vgs[vg].FreeExtents = f.vgs[vg].Free / fakeExtent
	}
	delete(f.lvs, key)
	return nil
}

// DeleteTags takes tags off an LV as lvchange --deltag does.
func (f *fakeLVM) DeleteTags(ctx context.Context, vg, name string, tags ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return err
	}
	if err := f.vgErrLocked(vg); err != nil {
		return err
	}
	lv, err := f.lvLocked(vg, name)
	if err != nil {
		return err
	}
	lv.Tags = slices.DeleteFunc(slices.Clone(lv.Tags), func(t string) bool { return slices.Contains(tags, t) })
	return nil
}

// DeactivateLV deactivates one LV as the lvm package does.
func (f *fakeLVM) DeactivateLV(ctx context.Context, vg, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return err
	}
	lv, err := f.lvLocked(vg, name)
	if err != nil {
		return err
	}
	if lv.Attr.Active {
		lv.Attr.Active = false
		f.deactivations = append(f.deactivations, vg+"/"+name)
	}
	return nil
}

// ActivateLV activates one LV as the lvm package does: a thin LV's pool
// with it, whatever the activation-skip flag.
func (f *fakeLVM) ActivateLV(ctx context.Context, vg, name string) (*lvm.LogicalVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return nil, err
	}
	lv, err := f.lvLocked(vg, name)
	if err != nil {
		return nil, err
	}
	if !lv.Attr.Active {
		lv.Attr.Active = true
		f.activations = append(f.activations, vg+"/"+name)
		if lv.Pool != "" {
			f.lvs[vg+"/"+lv.Pool].Attr.Active = true
		}
	}
	c := *lv
	return &c, nil
}

// CreateSnapshot makes a thin snapshot (inactive when it keeps the
// activation-skip flag) or a copy-on-write one taking CowSize of the VG,
// as the lvm package does.
func (f *fakeLVM) CreateSnapshot(ctx context.Context, req lvm.SnapshotRequest) (*lvm.LogicalVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.takeFailure(); err != nil {
		return nil, err
	}
	if err := f.vgErrLocked(req.VolumeGroup); err != nil {
		return nil, err
	}
	o, ok := f.lvs[req.VolumeGroup+"/"+req.Origin]
	if !ok {
		return nil, fmt.Errorf("origin %s: %w", req.Origin, lvm.ErrNotFound)
	}
	key := req.VolumeGroup + "/" + req.Name
	if _, ok := f.lvs[key]; ok {
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
		p := f.pools[req.VolumeGroup+"/"+o.Pool]
		p.VirtualSize += lv.Size
		p.ThinVolumes++
	} else {
		if o.Attr.Type != lvm.TypeThick {
			return nil, fmt.Errorf("origin %s is not thick: %w", req.Origin, lvm.ErrInvalidArgument)
		}
		size := roundUp(req.CowSize)
		vg := f.vgs[req.VolumeGroup]
		if size > vg.Free {
			return nil, fmt.Errorf("vg %s has %d bytes free, %d asked: %w", vg.Name, vg.Free, size, lvm.ErrInsufficientSpace)
		}
		vg.Free -= size
		vg.FreeExtents = vg.Free / fakeExtent
		lv.Size = size
		lv.Attr = lvm.Attributes{Type: lvm.TypeSnapshot, Active: o.Attr.Active, Health: lvm.HealthOK}
	}
	f.lvs[key] = lv
	c := *lv
	return &c, nil
}

var _ LVM = (*fakeLVM)(nil)
