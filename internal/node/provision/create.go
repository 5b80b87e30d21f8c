package provision

import (
	"context"
	"errors"
	"slices"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/volume"
)

// Request is one volume to make, checked by the caller.
type Request struct {
	// Name is the volume's name; the LV name derives from it.
	Name   string
	Class  *deviceclass.DeviceClass
	FSType string
	Range  Range
	// Params are the request's parameters; the claim's go into the LV's tags.
	Params map[string]string
	Source *Source
	// SourceTags record Source; a repeat must find them on the existing LV.
	SourceTags []string
	Block      bool
	IOLimits   volume.IOLimits
	Encryption *Encryption
}

// Range is a capacity range in bytes; 0 is unset.
type Range struct {
	Required, Limit int64
}

// Source names a volume's content source: a snapshot or a volume ID.
type Source struct {
	ID       string
	Snapshot bool
}

func (r *Request) phase() string {
	switch {
	case r.Source == nil:
		return metrics.PhaseCreate
	case r.Source.Snapshot:
		return metrics.PhaseRestore
	}
	return metrics.PhaseClone
}

type createCall struct {
	*Request
	lvName string
	method erase.Method
	phase  string
	// src is the resolved content source; srcErr says why it is nil.
	src    *contentSource
	srcErr error
	// fresh: this call made the copy's LV, so nothing was ever written to it.
	fresh bool
}

// Create returns the LV of a volume, ready to hand out. It is idempotent:
// the LV name derives from the request name and its tags carry name and
// class, so a retry (also after a restart) finds the LV it made.
func (p *Provisioner) Create(ctx context.Context, r *Request) (*lvm.LogicalVolume, error) {
	lvName := volume.LVNameFor(r.Name)
	unlock, err := p.Lock(lvName, "volume "+r.Name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	c := createCall{Request: r, lvName: lvName, method: EraseMethodFor(r.Class, r.Block), phase: r.phase()}
	if r.Encryption != nil {
		if p.cfg.LUKS == nil {
			return nil, errorf(ErrElsewhere, "volume %q: %s is %q and node %s has no cryptsetup", r.Name, volume.ParamEncryption, volume.EncryptionLUKS2, p.cfg.NodeName)
		}
		// Through dm-crypt the previous tenant's bytes read as noise: no zeroing.
		c.method = erase.None
	}
	lv, made, err := p.provision(ctx, &c)
	if err != nil {
		return nil, err
	}
	// Outside the room lock: copying or zeroing must not hold up other creates.
	if volume.CopyPending(lv.Tags) {
		if c.src == nil {
			return nil, errorf(ErrRefused, "volume %q: LV %s is still to be copied from its source, which cannot be read now: %v", r.Name, lv.Name, c.srcErr)
		}
		p.copying.Store(lvName, true)
		lv, err = p.copyInto(ctx, lv, r.Class, c.src, c.phase, p.sparseInto(&c))
		p.copying.Delete(lvName)
		if err != nil {
			return nil, err
		}
	}
	if lv, err = p.finish(ctx, lv, made, r.Class, c.method, clearsSignatures(r)); err != nil {
		return nil, err
	}
	if err := p.clearFormatting(lv.VolumeGroup, lv.Name); err != nil {
		return nil, errorf(ErrInternal, "volume %q: %v", r.Name, err)
	}
	if r.Encryption != nil {
		if err := p.ensureLUKS(ctx, lv, r, c.phase); err != nil {
			return nil, err
		}
	} else if r.Source != nil && c.src != nil && c.src.remote != nil {
		// A plain volume must not hand out another node's ciphertext as data.
		if has, err := p.cfg.HasLUKSHeader(p.devicePath(lv)); err == nil && has {
			if err := p.cfg.LVM.RemoveLV(ctx, lv.VolumeGroup, lv.Name); err != nil {
				klog.FromContext(ctx).Error(err, "Removing the copy of an encrypted source made for a plain volume")
			} else {
				p.cfg.View.Removed(lv.VolumeGroup, lv.Name)
			}
			return nil, encryptionMismatch(r, r.Source.ID, true)
		}
	}
	return lv, nil
}

// provision returns the LV made before, else a new one (made).
func (p *Provisioner) provision(ctx context.Context, c *createCall) (lv *lvm.LogicalVolume, made bool, err error) {
	// Under the room lock shared with NodeExpandVolume: two requests that each
	// fit alone must not both pass the check and together eat into the spare.
	unlockRoom, err := p.cfg.View.LockRoom(ctx, c.Class.VolumeGroup)
	if err != nil {
		return nil, false, wrap(err, "volume "+c.Name)
	}
	defer func() {
		if err != nil && ctx.Err() != nil {
			p.releaseRoomWhenSettled(ctx, c.Class.VolumeGroup, unlockRoom)
			return
		}
		unlockRoom()
	}()
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("volume", c.Name, "lv", c.lvName, "deviceClass", c.Class.Name))
	room, err := p.cfg.View.Capacity(c.Class)
	if errors.Is(err, vgview.ErrClassUnavailable) {
		lv, err := p.existingWhileUnavailable(ctx, c, err)
		return lv, false, err
	}
	if err != nil {
		return nil, false, wrap(err, "device class "+c.Class.Name)
	}
	size, err := p.sizeFor(ctx, c, room.ExtentSize)
	if err != nil {
		return nil, false, err
	}
	// A restore or clone's encryption must be its source's.
	if err := checkSourceEncryption(c.Request, c.src); err != nil {
		return nil, false, err
	}
	if lv, done, err := p.lookupExisting(ctx, c, size, &room); err != nil || done {
		return lv, false, err
	}
	if err := p.checkRoom(ctx, c.Class, size, &room); err != nil {
		return nil, false, err
	}
	if c.src != nil && c.src.copiesIntoThin(c.Class) {
		if err := p.checkCopyRoom(ctx, c, size); err != nil {
			return nil, false, err
		}
	}
	if c.src != nil {
		lv, err := p.makeFromSource(ctx, c, size)
		return lv, false, err
	}
	return p.create(ctx, c, size)
}

// releaseRoomWhenSettled releases vg's room lock once no mutation of vg runs
// and the view is re-read. An lvm command whose caller gave up goes on (it
// is never killed half-way) and its room is in no view yet: released at
// once, the next create's check would pass on the old free space.
func (p *Provisioner) releaseRoomWhenSettled(ctx context.Context, vg string, unlock func()) {
	s, ok := p.cfg.LVM.(Settler)
	if !ok {
		unlock()
		return
	}
	log := klog.FromContext(ctx)
	bg := context.WithoutCancel(ctx)
	go func() {
		defer unlock()
		// No deadline: lvm's own timeout bounds the command.
		if err := s.Settle(bg, vg); err != nil {
			log.Error(err, "Waiting for the lvm commands of a volume group", "vg", vg)
		}
		rctx, cancel := context.WithTimeout(bg, settledRefreshTimeout)
		defer cancel()
		if err := p.cfg.View.Refresh(rctx); err != nil {
			log.Error(err, "Refreshing the volume-group view after an lvm command whose caller gave up")
		}
	}()
}

const settledRefreshTimeout = time.Minute

// existingWhileUnavailable still answers a retry for a volume made before.
func (p *Provisioner) existingWhileUnavailable(ctx context.Context, c *createCall, why error) (*lvm.LogicalVolume, error) {
	lv, ok := p.cfg.View.FindLV(c.lvName)
	if !ok {
		// The scheduler should pick another node; GetCapacity reports 0 here.
		return nil, errorf(ErrNoRoom, "node %s cannot make volumes of device class %s now: %v", p.cfg.NodeName, c.Class.Name, why)
	}
	if err := p.compatible(&lv, c.Request); err != nil {
		return nil, err
	}
	if redo, err := p.mustRedo(&lv, c.method); err != nil || redo {
		if err != nil {
			return nil, err
		}
		return nil, errorf(ErrUnavailable, "volume %q: LV %s was left half-made and device class %s is unavailable now (%v); retry later",
			c.Name, volume.VolumeID(lv.VolumeGroup, lv.Name), c.Class.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Volume exists already; its device class is unavailable now", "size", lv.Size, "reason", why)
	return &lv, nil
}

// sizeFor also resolves c's source; an unreadable one matters only for a
// volume still to be made.
func (p *Provisioner) sizeFor(ctx context.Context, c *createCall, extent uint64) (uint64, error) {
	// Round as lvcreate does (extents per stripe) for limit_bytes and room.
	unit := extent
	if !c.Class.Thin() {
		unit = c.Class.LVCreateOptions.SizeUnit(extent)
	}
	size, err := VolumeSize(c.Range, unit, c.FSType)
	if err != nil {
		return 0, err
	}
	if c.Source != nil {
		if c.src, c.srcErr = p.resolveSource(ctx, c.Source); c.srcErr == nil {
			size, c.srcErr = sourceSize(size, c.src.size, unit, c.Range)
		}
	}
	return size, nil
}

// lookupExisting answers a repeat; a half-made LV is removed to be remade.
func (p *Provisioner) lookupExisting(ctx context.Context, c *createCall, size uint64, room *vgview.Capacity) (lv *lvm.LogicalVolume, done bool, err error) {
	found, ok := p.cfg.View.FindLV(c.lvName)
	if ok && c.srcErr == nil && volume.CopyPending(found.Tags) && c.src.copiesIntoThin(c.Class) {
		// Only a new thin LV reads the skipped zeros as zeros.
		return nil, false, p.removeUnfinishedCopy(ctx, &found, c, room)
	}
	if ok && (c.srcErr == nil && volume.CopyPending(found.Tags) || c.src != nil && c.src.thinInto(c.Class)) {
		// The caller redoes an unfinished copy; a crash may have left it ungrown.
		lv, err := p.existingFromSource(ctx, &found, c, size)
		return lv, true, err
	}
	if c.srcErr != nil && !ok {
		return nil, true, c.srcErr
	}
	if !ok {
		return nil, false, nil
	}
	if err := p.compatible(&found, c.Request); err != nil {
		return nil, true, err
	}
	redo, err := p.mustRedo(&found, c.method)
	if err != nil {
		return nil, true, err
	}
	if !redo {
		klog.FromContext(ctx).V(2).Info("Volume exists already", "size", found.Size)
		return &found, true, nil
	}
	redone, err := p.redo(ctx, &found)
	if err != nil || !redone {
		if err != nil {
			return nil, true, err
		}
		return &found, true, nil
	}
	if *room, err = p.cfg.View.Capacity(c.Class); err != nil {
		return nil, true, wrap(err, "device class "+c.Class.Name)
	}
	return nil, false, nil
}

// checkRoom checks class's room for size bytes and one LV of metadata. The
// view can be stale and a refusal moves the pod elsewhere, so LVM is read
// once before refusing.
func (p *Provisioner) checkRoom(ctx context.Context, class *deviceclass.DeviceClass, size uint64, room *vgview.Capacity) error {
	if size > room.Available || room.MetadataFull {
		var err error
		if rerr := p.cfg.View.Refresh(ctx); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "Refreshing the volume-group view before refusing a volume failed")
		} else if *room, err = p.cfg.View.Capacity(class); errors.Is(err, vgview.ErrClassUnavailable) {
			return errorf(ErrNoRoom, "node %s cannot make volumes of device class %s now: %v", p.cfg.NodeName, class.Name, err)
		} else if err != nil {
			return wrap(err, "device class "+class.Name)
		}
	}
	if room.MetadataFull {
		return errorf(ErrNoRoom, "volume group %s of device class %s on node %s has no room left in its LVM metadata area "+
			"for one more volume (whatever its free space); see \"Metadata area\" in docs/install.md", class.VolumeGroup, class.Name, p.cfg.NodeName)
	}
	if size > room.Available {
		return errorf(ErrNoRoom, "device class %s on node %s has %d bytes available (after a spare of %d), %d asked", class.Name, p.cfg.NodeName, room.Available, class.SpareBytes(), size)
	}
	return nil
}

// create makes c's LV with lvcreate. A thick LV is marked first, durably:
// lvcreate commits it before wiping and zeroing, so an LV left by a crash
// in between is never taken for finished.
func (p *Provisioner) create(ctx context.Context, c *createCall, size uint64) (lv *lvm.LogicalVolume, made bool, err error) {
	class := c.Class
	creq := lvm.CreateRequest{VolumeGroup: class.VolumeGroup, Name: c.lvName, Size: size,
		Tags: slices.Concat(volume.VolumeTags(c.Name, class.Name, c.Params), askedTags(c.Range, size), volume.IOLimitTags(c.IOLimits), encryptionTags(c.Request))}
	marked := false
	if class.Thin() {
		creq.ThinPool = class.ThinPool
	} else {
		creq.Options = class.LVCreateOptions
		if marked, err = p.cfg.Marks.Has(class.VolumeGroup, c.lvName); err == nil && !marked {
			err = p.cfg.Marks.Mark(class.VolumeGroup, c.lvName)
		}
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return nil, false, errorf(ErrNoRoom, "volume %q: the disk of this node's carve state directory (--state-dir) is full, so carve cannot mark the volume it would make: %v", c.Name, err)
		}
		if err != nil {
			return nil, false, errorf(ErrInternal, "volume %q: %v", c.Name, err)
		}
	}
	stepStart := time.Now()
	lv, err = p.cfg.LVM.CreateLV(ctx, creq)
	p.cfg.Metrics.ObserveStep(metrics.PhaseCreate, metrics.StepLVCreate, class.Name, time.Since(stepStart), err)
	if errors.Is(err, lvm.ErrAlreadyExists) {
		lv, err := p.existingAfterCreate(ctx, c, marked)
		return lv, false, err
	}
	if errors.Is(err, lvm.ErrInsufficientSpace) {
		if cerr := p.cfg.Marks.Clear(class.VolumeGroup, c.lvName); cerr != nil {
			klog.FromContext(ctx).Error(cerr, "Clearing the mark of a volume LVM had no room for")
		}
		// Something outside carve took space: re-read for true capacity.
		if rerr := p.cfg.View.Refresh(ctx); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "Refreshing the volume-group view after an out-of-space lvcreate failed")
		}
	}
	if err != nil {
		return nil, false, wrap(err, "creating LV "+volume.VolumeID(class.VolumeGroup, c.lvName))
	}
	p.cfg.View.Created(*lv)
	klog.FromContext(ctx).Info("Created volume", "size", lv.Size)
	return lv, true, nil
}

// existingAfterCreate answers when lvcreate found c's LV the view missed;
// marked: the mark predates this call.
func (p *Provisioner) existingAfterCreate(ctx context.Context, c *createCall, marked bool) (*lvm.LogicalVolume, error) {
	class := c.Class
	existing, err := p.cfg.LVM.GetLV(ctx, class.VolumeGroup, c.lvName)
	if err != nil {
		return nil, wrap(err, "looking up existing LV "+volume.VolumeID(class.VolumeGroup, c.lvName))
	}
	if err := p.compatible(existing, c.Request); err != nil {
		return nil, err
	}
	if !class.Thin() && !marked {
		// This call's mark, on an LV finished before that the view missed.
		if err := p.cfg.Marks.Clear(class.VolumeGroup, c.lvName); err != nil {
			return nil, errorf(ErrInternal, "volume %q: %v", c.Name, err)
		}
	}
	p.cfg.View.Created(*existing)
	redo, err := p.mustRedo(existing, c.method)
	if err != nil || !redo {
		if err != nil {
			return nil, err
		}
		return existing, nil
	}
	// Left by a crashed run; the next retry makes it again.
	redone, err := p.redo(ctx, existing)
	if err != nil {
		return nil, err
	}
	if !redone {
		return existing, nil
	}
	return nil, errorf(ErrBusy, "volume %q: removed LV %s, left half-made by an earlier attempt; retry to make it again",
		c.Name, volume.VolumeID(existing.VolumeGroup, existing.Name))
}

// askedTags record the asked size when carve makes more.
func askedTags(r Range, size uint64) []string {
	if asked := r.Required; asked > 0 && uint64(asked) < size {
		return []string{volume.AskedTag(uint64(asked), size)}
	}
	return nil
}

// mustRedo tells whether a crash left lv half-made and it must be made again:
// unfinished, nothing finishing it now, and not to be zeroed (zeroing covers
// lvcreate's wipe, so finish completes such an LV instead).
func (p *Provisioner) mustRedo(lv *lvm.LogicalVolume, method erase.Method) (bool, error) {
	if method != erase.None || p.finishing.Running(lv.Name) {
		return false, nil
	}
	return p.unfinished(lv)
}

func (p *Provisioner) unfinished(lv *lvm.LogicalVolume) (bool, error) {
	marked, err := p.cfg.Marks.Has(lv.VolumeGroup, lv.Name)
	if err != nil {
		return false, errorf(ErrInternal, "volume %s: %v", volume.VolumeID(lv.VolumeGroup, lv.Name), err)
	}
	return marked, nil
}

// redo removes a half-made LV, never handed out, to be made again; not ok
// when LVM shows it finished after all.
func (p *Provisioner) redo(ctx context.Context, lv *lvm.LogicalVolume) (ok bool, err error) {
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	// LVM decides, not the view: removing a handed-out volume loses data.
	cur, err := p.cfg.LVM.GetLV(ctx, lv.VolumeGroup, lv.Name)
	switch {
	case errors.Is(err, lvm.ErrNotFound):
		p.cfg.View.Removed(lv.VolumeGroup, lv.Name)
		return true, nil
	case err != nil:
		return false, wrap(err, "reading half-made LV "+id)
	}
	if half, err := p.unfinished(cur); err != nil || !half {
		if err == nil {
			p.cfg.View.Created(*cur)
			*lv = *cur
		}
		return false, err
	}
	if err := p.cfg.LVM.RemoveLV(ctx, lv.VolumeGroup, lv.Name); err != nil && !errors.Is(err, lvm.ErrNotFound) {
		return false, wrap(err, "removing half-made LV "+id)
	}
	p.cfg.View.Removed(lv.VolumeGroup, lv.Name)
	klog.FromContext(ctx).Info("Removed an LV left half-made by an earlier CreateVolume; making it again", "volumeID", id)
	return true, nil
}

// compatible checks a repeat: name, class, source and size in range.
func (p *Provisioner) compatible(lv *lvm.LogicalVolume, r *Request) error {
	if err := sameVolume(lv, r); err != nil {
		return err
	}
	if !sizeFits(lv.Size, r.Range) {
		return errorf(ErrMismatch, "volume %q exists with %d bytes; asked required_bytes %d, limit_bytes %d", r.Name, lv.Size, r.Range.Required, r.Range.Limit)
	}
	return nil
}

func sameVolume(lv *lvm.LogicalVolume, r *Request) error {
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	if !volume.HasVolumeName(lv.Tags, r.Name) {
		name, _, _ := volume.VolumeNameFromTags(lv.Tags)
		return errorf(ErrMismatch, "LV %s exists but does not carry volume %q in its tags (found %q)", id, r.Name, name)
	}
	if c, _ := volume.ClassFromTags(lv.Tags); c != r.Class.Name || lv.VolumeGroup != r.Class.VolumeGroup {
		return errorf(ErrMismatch, "volume %q exists in device class %q (LV %s); %q asked", r.Name, c, id, r.Class.Name)
	}
	if got := volume.SourceTags(lv.Tags); !slices.Equal(got, r.SourceTags) {
		return errorf(ErrMismatch, "volume %q exists with content source %q; %q asked", r.Name, got, r.SourceTags)
	}
	return nil
}
