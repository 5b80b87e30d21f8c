package lvm

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/lvmname"
)

// CreateLV creates a thick or thin LV, its size rounded up to extents.
// ErrAlreadyExists, ErrInsufficientSpace, ErrNotFound, ErrInvalidArgument.
// The result is built from the request: UUID is empty, Active/Open false.
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

func sortedTags(tags []string) []string {
	if len(tags) == 0 {
		return nil
	}
	t := slices.Clone(tags)
	slices.Sort(t)
	return slices.Compact(t)
}

// CreateThinSnapshot snapshots a thin origin without activation-skip.
func (c *Client) CreateThinSnapshot(ctx context.Context, vg, origin, name string, tags []string) (*LogicalVolume, error) {
	return c.CreateSnapshot(ctx, SnapshotRequest{VolumeGroup: vg, Origin: origin, Name: name, Tags: tags})
}

// CreateSnapshot creates a thin snapshot of a thin origin (CowSize zero) or
// a copy-on-write one of a thick origin. ErrNotFound, ErrInvalidArgument,
// ErrAlreadyExists, ErrInsufficientSpace.
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
	// The origin's kind decides which snapshot LVM makes: read it unless the
	// caller did (a changed origin fails lvcreate, which explainSnapshot reads).
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
		// LVM reports an old-style snapshot's lv_size as its copy-on-write space.
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

// ExtendLV grows an LV to at least size bytes; no-op when large enough.
func (c *Client) ExtendLV(ctx context.Context, vg, name string, size uint64) (*LogicalVolume, error) {
	if err := validateLV(vg, name); err != nil {
		return nil, err
	}
	if size > MaxSize {
		return nil, invalid("size %d is larger than %d bytes", size, uint64(MaxSize))
	}
	lv, unlock, err := c.lockLV(ctx, vg, name, "extending")
	if err != nil {
		return nil, err
	}
	defer func() { unlock() }()
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
	// LVM rounds striped and raid LVs to a geometry the report does not show.
	return c.GetLV(ctx, vg, name)
}

// lockLV takes vg's lock and reads vg/name under it; what, the operation,
// prefixes a failed read. Unless err is set, the caller holds the lock
// and releases it with unlock.
func (c *Client) lockLV(ctx context.Context, vg, name, what string) (lv *LogicalVolume, unlock func(), err error) {
	unlock, err = c.locks.Lock(ctx, vg)
	if err != nil {
		return nil, nil, err
	}
	lv, err = c.GetLV(ctx, vg, name)
	if err != nil {
		unlock()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return lv, unlock, nil
}

// ActivateLV activates vg/name (a thin LV's pool with it, activation-skip
// ignored) and returns it; an active LV needs no lvchange. An lvchange that
// leaves it inactive (activation/volume_list) is an error that says so.
func (c *Client) ActivateLV(ctx context.Context, vg, name string) (*LogicalVolume, error) {
	if err := validateLV(vg, name); err != nil {
		return nil, err
	}
	lv, unlock, err := c.lockLV(ctx, vg, name, "activating")
	if err != nil {
		return nil, err
	}
	defer func() { unlock() }()
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

// DeactivateLV deactivates vg/name; an inactive LV is left as it is.
func (c *Client) DeactivateLV(ctx context.Context, vg, name string) error {
	if err := c.changeLV(ctx, vg, name, "deactivating", deactivateArgs(vg, name)); err != nil {
		return err
	}
	klog.V(2).InfoS("deactivated logical volume", "vg", vg, "lv", name)
	return nil
}

func (c *Client) changeLV(ctx context.Context, vg, name, what string, args []string) error {
	return c.mutateLV(ctx, vg, name, args, func(err error) error { return c.explainChange(ctx, vg, name, what, err) })
}

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

// DeleteTags takes tags off vg/name in one commit; missing tags are fine.
func (c *Client) DeleteTags(ctx context.Context, vg, name string, tags ...string) error {
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

// ChangeTags changes vg/name's tags in one commit, converging on repeat.
func (c *Client) ChangeTags(ctx context.Context, vg, name string, add, del []string) error {
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

// RenameLV renames vg/name; ErrNotFound, ErrAlreadyExists.
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

// RemoveLV removes an LV without looking it up first; ErrNotFound, ErrInUse.
func (c *Client) RemoveLV(ctx context.Context, vg, name string) error {
	err := c.mutateLV(ctx, vg, name, removeArgs(vg, name), func(err error) error { return c.explainRemove(ctx, vg, name, err) })
	if err != nil {
		return err
	}
	klog.V(2).InfoS("removed logical volume", "vg", vg, "lv", name)
	return nil
}
