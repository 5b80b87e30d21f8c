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
// the LV name derives from the request name, and the LV's tags carry the
// name and class, so a retry (also after a restart) finds the LV it made.
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
		// Through dm-crypt the previous tenant's bytes read as noise,
		// never as their plaintext: nothing to zero.
		c.method = erase.None
	}
	lv, made, err := p.provision(ctx, &c)
	if err != nil {
		return nil, err
	}
	// Outside the room lock: copying or zeroing a large volume must not
	// hold up the other creates of the volume group.
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
		// A source on another node was not seen before the copy: a plain
		// volume must not hand out another node's ciphertext as data.
		if has, err := p.cfg.HasLUKSHeader(p.devicePath(lv)); err == nil && has {
			// Never handed out: removed, so that no orphan is left.
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

// provision returns the LV of a Create: the one made before when it is a
// repeat, else a new one made by lvcreate (made is then true). Either may
// still be unfinished (finish makes it ready).
func (p *Provisioner) provision(ctx context.Context, c *createCall) (lv *lvm.LogicalVolume, made bool, err error) {
	// The room check and lvcreate run under the volume group's room lock,
	// shared with NodeExpandVolume: two volumes (or a volume and a growth)
	// that each fit alone must not both pass the check and together eat
	// into the spare.
	unlockRoom, err := p.cfg.View.LockRoom(ctx, c.Class.VolumeGroup)
	if err != nil {
		return nil, false, wrap(err, "volume "+c.Name)
	}
	defer func() {
		if err != nil && ctx.Err() != nil {
			// The caller gave up, maybe under a running lvcreate.
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
	// Before anything is made: a restore or clone's encryption must be
	// its source's.
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

// releaseRoomWhenSettled releases the room lock of vg (unlock) once no
// mutation of vg runs any more, and the view has been re-read. An lvm
// command whose caller gave up goes on in the background (it is never
// killed half-way) and keeps the volume group's LVM lock, but the room it
// takes is in neither the view nor any room check: released at once, the
// next create's check would pass on the old free space and, once that
// lvcreate ends, eat into the spare. An LVM without Settler is released
// at once.
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
		// No deadline: the command is bounded by lvm's own timeout, and
		// while it runs no mutation of vg can start anyway.
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

// existingWhileUnavailable answers while c's class is unavailable (why):
// a retry for a volume made before the class became unavailable (a PV
// lost since, say) still gets its volume; nothing new is made.
func (p *Provisioner) existingWhileUnavailable(ctx context.Context, c *createCall, why error) (*lvm.LogicalVolume, error) {
	lv, ok := p.cfg.View.FindLV(c.lvName)
	if !ok {
		// Not a fault of the request: the scheduler should pick another
		// node, as GetCapacity reports 0 for the class here.
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

// sizeFor is the size of c's volume, and resolves its source (c.src, or
// c.srcErr: a source that cannot be read is an error only for a volume
// still to be made).
func (p *Provisioner) sizeFor(ctx context.Context, c *createCall, extent uint64) (uint64, error) {
	// LVM rounds a striped LV to whole extents per stripe: size it the
	// same way here, so that limit_bytes and the room check see what
	// lvcreate will make.
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

// lookupExisting answers a repeat from the LV made before, when done; it
// removes a half-made one (and re-reads the room) so that it is made again.
func (p *Provisioner) lookupExisting(ctx context.Context, c *createCall, size uint64, room *vgview.Capacity) (lv *lvm.LogicalVolume, done bool, err error) {
	found, ok := p.cfg.View.FindLV(c.lvName)
	if ok && c.srcErr == nil && volume.CopyPending(found.Tags) && c.src.copiesIntoThin(c.Class) {
		// A copy into a thin LV skips the source's zeros, which only a
		// new LV reads as zeros: make it anew.
		return nil, false, p.removeUnfinishedCopy(ctx, &found, c, room)
	}
	if ok && (c.srcErr == nil && volume.CopyPending(found.Tags) || c.src != nil && c.src.thinInto(c.Class)) {
		// A copy left unfinished is redone by the caller; a thin volume
		// made from a smaller source is grown if a crash came between.
		lv, err := p.existingFromSource(ctx, &found, c, size)
		return lv, true, err
	}
	if c.srcErr != nil && !ok {
		// A volume made from a source stays made when the source is
		// deleted afterwards; only one still to be made needs it.
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

// checkRoom checks that class has room for size bytes and one more LV in
// its metadata. The view can be stale: space freed outside carve shows
// only at the next periodic refresh, and a refusal makes Kubernetes move
// the pod to another node, so LVM is read once before refusing.
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

// create makes c's LV of size bytes with lvcreate. A thick LV is marked
// first: lvcreate commits a thick LV before it wipes and zeroes it, and
// the mark, made durable first, stays until finish, so that an LV left by
// a crash in between is never taken for a finished one.
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
			// The node's disk, not the volume group: another node may do.
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
		// lvcreate committed nothing: the mark would only be left over.
		if cerr := p.cfg.Marks.Clear(class.VolumeGroup, c.lvName); cerr != nil {
			klog.FromContext(ctx).Error(cerr, "Clearing the mark of a volume LVM had no room for")
		}
		// LVM had less room than the view: something outside carve took
		// space. Re-read now so that the capacity published next (the
		// provisioner asks again right after this error) is true.
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

// existingAfterCreate answers when lvcreate found c's LV there: the view
// missed it (made outside carve's view, or it was stale), so LVM is asked
// and the call is a repeat. marked says the mark was there before this
// call.
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
		// The mark is this call's own, and the LV is not the one it was
		// made for: an LV made before (and finished) that the view
		// missed.
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
	// Made by a run that crashed before finishing it; the next retry
	// finds it in the view and makes it again.
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

// askedTags are the tags of a volume of size bytes made for r: the asked
// size, when carve makes more (volume.AskedTag).
func askedTags(r Range, size uint64) []string {
	if asked := r.Required; asked > 0 && uint64(asked) < size {
		return []string{volume.AskedTag(uint64(asked), size)}
	}
	return nil
}

// mustRedo tells whether an existing LV was left half-made by a crash and
// must be made again: it is still unfinished, nothing is finishing it now,
// and it will not be zeroed (zeroing covers what lvcreate's wipe would have
// done, so finish completes such an LV instead).
func (p *Provisioner) mustRedo(lv *lvm.LogicalVolume, method erase.Method) (bool, error) {
	if method != erase.None || p.finishing.Running(lv.Name) {
		return false, nil
	}
	return p.unfinished(lv)
}

// unfinished tells whether an LV has not been made ready yet: it has a mark
// (marks.Marks).
func (p *Provisioner) unfinished(lv *lvm.LogicalVolume) (bool, error) {
	marked, err := p.cfg.Marks.Has(lv.VolumeGroup, lv.Name)
	if err != nil {
		return false, errorf(ErrInternal, "volume %s: %v", volume.VolumeID(lv.VolumeGroup, lv.Name), err)
	}
	return marked, nil
}

// redo removes a half-made LV, which was never handed out, so that it is
// made again with lvcreate's wipe and zeroing. ok is false when LVM shows
// the LV finished after all (the view was older): then it is kept, and the
// caller returns lv as it is.
func (p *Provisioner) redo(ctx context.Context, lv *lvm.LogicalVolume) (ok bool, err error) {
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	// LVM, not the view, decides: removing a volume that was handed out
	// would lose its data.
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

// compatible checks that an existing LV is the volume r asks for again:
// its name, class and source, and a size within the capacity range.
func (p *Provisioner) compatible(lv *lvm.LogicalVolume, r *Request) error {
	if err := sameVolume(lv, r); err != nil {
		return err
	}
	if !sizeFits(lv.Size, r.Range) {
		return errorf(ErrMismatch, "volume %q exists with %d bytes; asked required_bytes %d, limit_bytes %d", r.Name, lv.Size, r.Range.Required, r.Range.Limit)
	}
	return nil
}

// sameVolume checks the name, class and source of an existing LV against
// a repeated request.
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
