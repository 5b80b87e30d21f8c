package lvm

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/lvmname"
)

// CreateLV creates a thick or thin LV, its size rounded up to whole extents.
// ErrAlreadyExists, ErrInsufficientSpace (VG or pool), ErrNotFound (VG or
// pool), ErrInvalidArgument. The result is built from the request, not read
// back: UUID is empty and Attr.Active/Open are false (GetLV has them).
func (c *Client) CreateLV(ctx context.Context, req CreateRequest) (*LogicalVolume, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	unlock, err := c.locks.Lock(ctx, req.VolumeGroup)
	if err != nil {
		return nil, err
	}
	defer func() { unlock() }()
	ext, err := c.extentSize(ctx, req.VolumeGroup)
	if err != nil {
		return nil, fmt.Errorf("creating %s/%s: %w", req.VolumeGroup, req.Name, err)
	}
	size := roundToExtents(req.Size, ext, req.Options.Stripes)
	if _, err := c.mutate(ctx, &unlock, createArgs(req, size)...); err != nil {
		return nil, c.explainCreate(ctx, req, size/ext, err)
	}
	lv := &LogicalVolume{
		Name:        req.Name,
		VolumeGroup: req.VolumeGroup,
		Size:        size,
		Tags:        sortedTags(req.Tags),
		Attr:        Attributes{Type: TypeThick, Health: HealthOK},
		Path:        c.lvPath(req.VolumeGroup, req.Name),
		Layout:      layoutOf(req),
	}
	if req.ThinPool != "" {
		lv.Attr.Type = TypeThin
		lv.Pool = req.ThinPool
	}
	klog.V(2).InfoS("created logical volume", "vg", lv.VolumeGroup, "lv", lv.Name, "size", lv.Size, "pool", lv.Pool)
	return lv, nil
}

// layoutOf is the lv_layout LVM gives the LV a request makes.
func layoutOf(req CreateRequest) string {
	switch {
	case req.ThinPool != "":
		return "thin,sparse"
	case req.Options.Mirrors > 0:
		return "raid,raid1"
	case req.Options.Stripes > 1:
		return "striped"
	}
	return "linear"
}

// sortedTags returns the tags as LVM reports them: sorted, duplicates once.
func sortedTags(tags []string) []string {
	if len(tags) == 0 {
		return nil
	}
	t := slices.Clone(tags)
	slices.Sort(t)
	return slices.Compact(t)
}

// CreateThinSnapshot creates a thin snapshot named name of the thin LV
// origin, with activation not skipped: CreateSnapshot with no
// copy-on-write size.
func (c *Client) CreateThinSnapshot(ctx context.Context, vg, origin, name string, tags []string) (*LogicalVolume, error) {
	return c.CreateSnapshot(ctx, SnapshotRequest{VolumeGroup: vg, Origin: origin, Name: name, Tags: tags})
}

// CreateSnapshot creates a thin snapshot of a thin origin (req.CowSize zero)
// or a copy-on-write snapshot of a thick one. ErrNotFound, ErrInvalidArgument
// (origin of the wrong kind, bad name or tag), ErrAlreadyExists,
// ErrInsufficientSpace. The result has the origin's size and pool, or the
// copy-on-write size; Time is the call's.
func (c *Client) CreateSnapshot(ctx context.Context, req SnapshotRequest) (*LogicalVolume, error) {
	vg, origin, name := req.VolumeGroup, req.Origin, req.Name
	if err := lvmname.VG(vg); err != nil {
		return nil, err
	}
	if err := validateName("origin", origin); err != nil {
		return nil, err
	}
	if err := lvmname.LV(name); err != nil {
		return nil, err
	}
	if err := validateTags(req.Tags); err != nil {
		return nil, err
	}
	if req.CowSize > MaxSize {
		return nil, invalid("copy-on-write size %d is larger than %d bytes", req.CowSize, uint64(MaxSize))
	}
	unlock, err := c.locks.Lock(ctx, vg)
	if err != nil {
		return nil, err
	}
	defer func() { unlock() }()
	// The origin's size and pool are part of the result, and its kind
	// decides which snapshot LVM would make: read it first, unless the
	// caller knows it (an origin that changed meanwhile fails lvcreate,
	// which explainSnapshot reads).
	o := req.OriginLV
	if o == nil || o.Name != origin || o.VolumeGroup != vg {
		if o, err = c.GetLV(ctx, vg, origin); err != nil {
			return nil, fmt.Errorf("snapshot %s/%s of %s: %w", vg, name, origin, err)
		}
	}
	var size uint64
	lv := &LogicalVolume{
		Name:        name,
		VolumeGroup: vg,
		Size:        o.Size,
		Tags:        sortedTags(req.Tags),
		Attr:        Attributes{Type: TypeThin, Health: HealthOK, ActivationSkip: req.ActivationSkip},
		Pool:        o.Pool,
		Origin:      origin,
		Path:        c.lvPath(vg, name),
		Layout:      o.Layout,
	}
	if req.CowSize == 0 {
		if o.Attr.Type != TypeThin {
			return nil, invalid("snapshot %s/%s: origin %s is a %s volume, only thin volumes have thin snapshots", vg, name, origin, o.Attr.Type)
		}
	} else {
		if o.Attr.Type != TypeThick || o.Origin != "" {
			return nil, invalid("snapshot %s/%s: origin %s is a %s volume, only thick volumes have copy-on-write snapshots", vg, name, origin, o.Attr.Type)
		}
		ext, err := c.extentSize(ctx, vg)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s/%s of %s: %w", vg, name, origin, err)
		}
		size = roundToExtents(req.CowSize, ext, 0)
		// LVM reports an old-style snapshot's lv_size as its
		// copy-on-write space, which is what it takes from the VG.
		lv.Attr = Attributes{Type: TypeSnapshot, Health: HealthOK}
		lv.Size, lv.Pool, lv.Layout = size, "", "linear"
	}
	if _, err := c.mutate(ctx, &unlock, snapshotArgs(req, size)...); err != nil {
		return nil, c.explainSnapshot(ctx, vg, origin, name, err)
	}
	lv.Time = time.Now().Truncate(time.Second)
	klog.V(2).InfoS("created snapshot", "vg", vg, "lv", name, "origin", origin, "cowSize", size)
	return lv, nil
}

// ExtendLV grows an LV to at least size bytes (rounded up to extents). An LV
// that is already that large is returned unchanged, without running
// lvextend. ErrNotFound when the LV does not exist, ErrInsufficientSpace
// when the VG cannot hold the growth.
func (c *Client) ExtendLV(ctx context.Context, vg, name string, size uint64) (*LogicalVolume, error) {
	if err := validateLV(vg, name); err != nil {
		return nil, err
	}
	if size > MaxSize {
		return nil, invalid("size %d is larger than %d bytes", size, uint64(MaxSize))
	}
	unlock, err := c.locks.Lock(ctx, vg)
	if err != nil {
		return nil, err
	}
	defer func() { unlock() }()
	lv, err := c.GetLV(ctx, vg, name)
	if err != nil {
		return nil, fmt.Errorf("extending: %w", err)
	}
	if lv.Size >= size {
		return lv, nil
	}
	ext, err := c.extentSize(ctx, vg)
	if err != nil {
		return nil, fmt.Errorf("extending %s/%s: %w", vg, name, err)
	}
	newSize := roundToExtents(size, ext, 1)
	if _, err := c.mutate(ctx, &unlock, extendArgs(vg, name, newSize)...); err != nil {
		return c.explainExtend(ctx, lv, size, newSize/ext, err)
	}
	klog.V(2).InfoS("extended logical volume", "vg", vg, "lv", name, "from", lv.Size, "to", newSize)
	switch lv.Layout {
	case "linear", "thin,sparse":
		lv.Size = newSize
		return lv, nil
	}
	// Striped and raid LVs are rounded by LVM to their geometry, which the
	// LV report does not show: read the size LVM chose.
	return c.GetLV(ctx, vg, name)
}

// ActivateLV activates the LV vg/name (a thin LV's pool with it, the
// activation-skip flag ignored) and returns it as LVM reports it; an active
// LV is returned without lvchange. ErrNotFound; an lvchange that leaves the
// LV inactive (activation/volume_list) is an error that says so. It holds the
// VG's lock and costs two reads, but runs only after a reboot or deactivation.
func (c *Client) ActivateLV(ctx context.Context, vg, name string) (*LogicalVolume, error) {
	if err := validateLV(vg, name); err != nil {
		return nil, err
	}
	unlock, err := c.locks.Lock(ctx, vg)
	if err != nil {
		return nil, err
	}
	defer func() { unlock() }()
	lv, err := c.GetLV(ctx, vg, name)
	if err != nil {
		return nil, fmt.Errorf("activating: %w", err)
	}
	if lv.Attr.Active {
		return lv, nil
	}
	if _, err := c.mutate(ctx, &unlock, activateArgs(vg, name, lv.Attr.ActivationSkip)...); err != nil {
		return c.explainActivate(ctx, vg, name, err)
	}
	got, err := c.GetLV(ctx, vg, name)
	if err != nil {
		return nil, fmt.Errorf("reading %s/%s after activating it: %w", vg, name, err)
	}
	if !got.Attr.Active {
		return nil, fmt.Errorf("activating %s/%s: lvchange succeeded but the LV is still inactive (lv_attr %s); "+
			"check activation/volume_list in lvm.conf", vg, name, got.Attr.Raw)
	}
	if got.Path == "" {
		got.Path = c.lvPath(vg, name)
	}
	klog.V(2).InfoS("activated logical volume", "vg", vg, "lv", name, "pool", got.Pool, "ignoredActivationSkip", lv.Attr.ActivationSkip)
	return got, nil
}

// DeactivateLV deactivates the LV vg/name (lvchange --activate n): its
// device node goes. An inactive LV is left as it is. ErrNotFound when the
// LV does not exist; an open LV is lvchange's own error.
func (c *Client) DeactivateLV(ctx context.Context, vg, name string) error {
	if err := c.changeLV(ctx, vg, name, "deactivating", deactivateArgs(vg, name)); err != nil {
		return err
	}
	klog.V(2).InfoS("deactivated logical volume", "vg", vg, "lv", name)
	return nil
}

// changeLV runs one lvchange-like mutation of the LV vg/name; a failure
// is explained from LVM state (explainChange, what names the change in its
// message).
func (c *Client) changeLV(ctx context.Context, vg, name, what string, args []string) error {
	return c.mutateLV(ctx, vg, name, args, func(err error) error { return c.explainChange(ctx, vg, name, what, err) })
}

// mutateLV runs one mutation (args) of the LV vg/name under its VG's lock,
// the names checked first; a failure is what explain makes of it.
func (c *Client) mutateLV(ctx context.Context, vg, name string, args []string, explain func(error) error) error {
	if err := validateLV(vg, name); err != nil {
		return err
	}
	unlock, err := c.locks.Lock(ctx, vg)
	if err != nil {
		return err
	}
	defer func() { unlock() }()
	if _, err := c.mutate(ctx, &unlock, args...); err != nil {
		return explain(err)
	}
	return nil
}

// DeleteTags takes tags off the LV vg/name with one lvchange (one metadata
// commit). A tag the LV does not carry is no error, so a repeat converges.
// ErrNotFound when the LV does not exist, ErrVolumeGroupNotFound when its
// VG does not.
func (c *Client) DeleteTags(ctx context.Context, vg, name string, tags ...string) error {
	// changeLV checks vg and name.
	if len(tags) == 0 {
		return invalid("deleting tags of %s/%s: no tag named", vg, name)
	}
	if err := validateTags(tags); err != nil {
		return err
	}
	if err := c.changeLV(ctx, vg, name, "deleting tags of", delTagsArgs(vg, name, tags)); err != nil {
		return err
	}
	klog.V(2).InfoS("deleted tags of logical volume", "vg", vg, "lv", name, "tags", tags)
	return nil
}

// ChangeTags takes the tags del off the LV vg/name and puts the tags add
// on, with one lvchange (one metadata commit). A tag to delete that the LV
// does not carry, or one to add that it carries, is no error, so a repeat
// converges. ErrNotFound when the LV does not exist, ErrVolumeGroupNotFound
// when its VG does not.
func (c *Client) ChangeTags(ctx context.Context, vg, name string, add, del []string) error {
	// changeLV checks vg and name.
	if len(add)+len(del) == 0 {
		return invalid("changing tags of %s/%s: no tag named", vg, name)
	}
	if err := validateTags(append(slices.Clone(add), del...)); err != nil {
		return err
	}
	if err := c.changeLV(ctx, vg, name, "changing tags of", changeTagsArgs(vg, name, add, del)); err != nil {
		return err
	}
	klog.V(2).InfoS("changed tags of logical volume", "vg", vg, "lv", name, "added", add, "deleted", del)
	return nil
}

// RenameLV renames the LV vg/name to newName (lvrename): its device node
// follows the name when it is active. ErrNotFound when the LV (or its VG)
// does not exist, ErrAlreadyExists when newName is taken.
func (c *Client) RenameLV(ctx context.Context, vg, name, newName string) error {
	if err := lvmname.VG(vg); err != nil {
		return err
	}
	for _, n := range []string{name, newName} {
		if err := validateName("logical volume", n); err != nil {
			return err
		}
	}
	unlock, err := c.locks.Lock(ctx, vg)
	if err != nil {
		return err
	}
	defer func() { unlock() }()
	if _, err := c.mutate(ctx, &unlock, renameArgs(vg, name, newName)...); err != nil {
		return c.explainRename(ctx, vg, name, newName, err)
	}
	klog.V(2).InfoS("renamed logical volume", "vg", vg, "lv", name, "to", newName)
	return nil
}

// RemoveLV removes an LV; ErrNotFound when it (or its VG) does not exist,
// ErrInUse when it is open. It runs lvremove without looking the LV up first;
// only a failure costs a read, to tell why.
func (c *Client) RemoveLV(ctx context.Context, vg, name string) error {
	err := c.mutateLV(ctx, vg, name, removeArgs(vg, name), func(err error) error { return c.explainRemove(ctx, vg, name, err) })
	if err != nil {
		return err
	}
	klog.V(2).InfoS("removed logical volume", "vg", vg, "lv", name)
	return nil
}
