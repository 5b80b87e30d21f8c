package lvm

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// A failed mutation is classified from LVM's state read afresh under the VG
// lock still held, and from the exit status: 2 or 3 is ErrInvalidArgument;
// then facts of the report (missing VG, origin or pool, LV exists, too few
// extents, pool full, LV open); only then LVM's message ("insufficient":
// extents stripes or raid images cannot use). Only failures pay the read.

const (
	exitNoSuchCommand   = 2
	exitInvalidCmdLine  = 3
	insufficientMessage = "insufficient"
)

func classify(err, kind error, reason string) error {
	var ce *CommandError
	if errors.As(err, &ce) {
		ce.Kind = kind
		return fmt.Errorf("%s: %w", reason, err)
	}
	return fmt.Errorf("%s: %w: %w", reason, kind, err)
}

func commandFacts(err error) (exitCode int, stderr string, ok bool) {
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Err != nil {
		return 0, "", false
	}
	return ce.ExitCode, ce.Stderr, true
}

// failureState reads only vg, so another unreadable VG does not stop the
// classification; a returned error is returned as is.
func (c *Client) failureState(ctx context.Context, vg, what string, err error) (*Report, int, string, error) {
	code, stderr, ok := commandFacts(err)
	if !ok || ctx.Err() != nil {
		return nil, 0, "", fmt.Errorf("%s: %w", what, err)
	}
	if code == exitNoSuchCommand || code == exitInvalidCmdLine {
		return nil, 0, "", classify(err, ErrInvalidArgument, what+": LVM rejected the command line")
	}
	rep, rerr := c.Report(ctx, vg)
	if errors.Is(rerr, ErrVolumeGroupNotFound) {
		rep, rerr = &Report{}, nil
	}
	if rerr != nil {
		return nil, 0, "", fmt.Errorf("%s: %w (reading the state to classify the failure failed too: %v)", what, err, rerr) //nolint:errorlint // the re-read failure is context; wrapping it would let errors.Is classify by it
	}
	return rep, code, stderr, nil
}

func hintsInsufficient(stderr string) bool {
	return strings.Contains(strings.ToLower(stderr), insufficientMessage)
}

func poolFull(p *ThinPool) bool { return p.DataPercent >= 100 || p.MetadataPercent >= 100 }

func (c *Client) explainCreate(ctx context.Context, req CreateRequest, extents uint64, err error) error {
	what := fmt.Sprintf("creating %s/%s", req.VolumeGroup, req.Name)
	rep, _, stderr, ferr := c.failureState(ctx, req.VolumeGroup, what, err)
	if rep == nil {
		return ferr
	}
	vg := rep.FindVG(req.VolumeGroup)
	if vg == nil {
		return classify(err, ErrVolumeGroupNotFound, what+": volume group does not exist")
	}
	if rep.FindLV(req.VolumeGroup, req.Name) != nil {
		return classify(err, ErrAlreadyExists, what+": the name is taken")
	}
	if vg.MetadataFull() {
		// No LV fits in a full metadata area, however many extents are free.
		return classify(err, ErrInsufficientSpace, fmt.Sprintf("%s: the volume group's metadata area is full (%d of %d bytes free)",
			what, vg.MetadataAreaFree, vg.MetadataAreaSize))
	}
	if vg.MissingPVs > 0 {
		// LVM changes nothing in a partial VG, and the missing PVs' extents are
		// gone: no space until an operator restores or removes the PV.
		return classify(err, ErrInsufficientSpace, fmt.Sprintf("%s: %d physical volume(s) of the volume group are missing; LVM allocates nothing in it",
			what, vg.MissingPVs))
	}
	if req.ThinPool != "" {
		p := rep.FindThinPool(req.VolumeGroup, req.ThinPool)
		switch {
		case p == nil:
			return classify(err, ErrNotFound, fmt.Sprintf("%s: thin pool %s does not exist", what, req.ThinPool))
		case poolFull(p):
			return classify(err, ErrInsufficientSpace, fmt.Sprintf("%s: thin pool %s is full (data %.2f%%, metadata %.2f%%)",
				what, p.Name, p.DataPercent, p.MetadataPercent))
		}
	} else {
		o := req.Options
		if need := extentsNeeded(extents, o); need > vg.FreeExtents {
			return classify(err, ErrInsufficientSpace, fmt.Sprintf("%s: volume group has %d free extents, %d needed",
				what, vg.FreeExtents, need))
		}
		if o.Stripes > vg.PVCount {
			return classify(err, ErrInvalidArgument, fmt.Sprintf("%s: %d stripes need %d physical volumes, the volume group has %d",
				what, o.Stripes, o.Stripes, vg.PVCount))
		}
		if o.Mirrors+1 > vg.PVCount {
			return classify(err, ErrInvalidArgument, fmt.Sprintf("%s: raid1 with %d mirrors needs %d physical volumes, the volume group has %d",
				what, o.Mirrors, o.Mirrors+1, vg.PVCount))
		}
	}
	if hintsInsufficient(stderr) {
		return classify(err, ErrInsufficientSpace, what+": LVM found too little allocatable space for this layout")
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (c *Client) explainSnapshot(ctx context.Context, vg, origin, name string, err error) error {
	what := fmt.Sprintf("creating snapshot %s/%s of %s", vg, name, origin)
	rep, _, stderr, ferr := c.failureState(ctx, vg, what, err)
	if rep == nil {
		return ferr
	}
	if rep.FindVG(vg) == nil {
		return classify(err, ErrVolumeGroupNotFound, what+": volume group does not exist")
	}
	if rep.FindLV(vg, name) != nil {
		return classify(err, ErrAlreadyExists, what+": the name is taken")
	}
	o := rep.FindLV(vg, origin)
	if o == nil {
		return classify(err, ErrNotFound, what+": the origin does not exist")
	}
	if p := rep.FindThinPool(vg, o.Pool); p != nil && poolFull(p) {
		return classify(err, ErrInsufficientSpace, fmt.Sprintf("%s: thin pool %s is full", what, p.Name))
	}
	if hintsInsufficient(stderr) {
		return classify(err, ErrInsufficientSpace, what+": LVM found too little space")
	}
	return fmt.Errorf("%s: %w", what, err)
}

// explainExtend: an LV grown large enough meanwhile is a success.
func (c *Client) explainExtend(ctx context.Context, lv *LogicalVolume, size, extents uint64, err error) (*LogicalVolume, error) {
	what := fmt.Sprintf("extending %s/%s", lv.VolumeGroup, lv.Name)
	rep, _, stderr, ferr := c.failureState(ctx, lv.VolumeGroup, what, err)
	if rep == nil {
		return nil, ferr
	}
	cur := rep.FindLV(lv.VolumeGroup, lv.Name)
	vg := rep.FindVG(lv.VolumeGroup)
	if cur == nil || vg == nil {
		return nil, classify(err, ErrNotFound, what+": the logical volume does not exist")
	}
	if cur.Size >= size {
		return cur, nil
	}
	if cur.Attr.Type == TypeThin {
		if p := rep.FindThinPool(cur.VolumeGroup, cur.Pool); p != nil && poolFull(p) {
			return nil, classify(err, ErrInsufficientSpace, fmt.Sprintf("%s: thin pool %s is full", what, p.Name))
		}
	} else if vg.ExtentSize > 0 {
		if grow := extents - cur.Size/vg.ExtentSize; grow > vg.FreeExtents {
			return nil, classify(err, ErrInsufficientSpace, fmt.Sprintf("%s: volume group has %d free extents, %d needed",
				what, vg.FreeExtents, grow))
		}
	}
	if hintsInsufficient(stderr) {
		return nil, classify(err, ErrInsufficientSpace, what+": LVM found too little allocatable space")
	}
	return nil, fmt.Errorf("%s: %w", what, err)
}

func (c *Client) explainRemove(ctx context.Context, vg, name string, err error) error {
	what := fmt.Sprintf("removing %s/%s", vg, name)
	rep, _, _, ferr := c.failureState(ctx, vg, what, err)
	if rep == nil {
		return ferr
	}
	lv := rep.FindLV(vg, name)
	switch {
	case rep.FindVG(vg) == nil:
		return classify(err, ErrVolumeGroupNotFound, what+": volume group does not exist")
	case lv == nil:
		return classify(err, ErrNotFound, what+": the logical volume does not exist")
	case lv.Attr.Open:
		return classify(err, ErrInUse, what+": the logical volume is open")
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (c *Client) explainChange(ctx context.Context, vg, name, doing string, err error) error {
	return c.explainLV(ctx, vg, name, fmt.Sprintf("%s %s/%s", doing, vg, name), err, nil)
}

func (c *Client) explainRename(ctx context.Context, vg, name, newName string, err error) error {
	what := fmt.Sprintf("renaming %s/%s to %s", vg, name, newName)
	return c.explainLV(ctx, vg, name, what, err, func(rep *Report) error {
		if rep.FindLV(vg, newName) != nil {
			return classify(err, ErrAlreadyExists, what+": the name is taken")
		}
		return nil
	})
}

// explainLV: the VG or LV gone, then more, else the command's error.
func (c *Client) explainLV(ctx context.Context, vg, name, what string, err error, more func(*Report) error) error {
	rep, _, _, ferr := c.failureState(ctx, vg, what, err)
	if rep == nil {
		return ferr
	}
	switch {
	case rep.FindVG(vg) == nil:
		return classify(err, ErrVolumeGroupNotFound, what+": volume group does not exist")
	case rep.FindLV(vg, name) == nil:
		return classify(err, ErrNotFound, what+": the logical volume does not exist")
	}
	if more != nil {
		if e := more(rep); e != nil {
			return e
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// explainActivate: an LV found active after all is a success.
func (c *Client) explainActivate(ctx context.Context, vg, name string, err error) (*LogicalVolume, error) {
	what := fmt.Sprintf("activating %s/%s", vg, name)
	rep, _, _, ferr := c.failureState(ctx, vg, what, err)
	if rep == nil {
		return nil, ferr
	}
	v := rep.FindVG(vg)
	lv := rep.FindLV(vg, name)
	switch {
	case v == nil:
		return nil, classify(err, ErrVolumeGroupNotFound, what+": volume group does not exist")
	case lv == nil:
		return nil, classify(err, ErrNotFound, what+": the logical volume does not exist")
	case lv.Attr.Active:
		return lv, nil
	case v.MissingPVs > 0:
		return nil, fmt.Errorf("%s: %d physical volume(s) of the volume group are missing: %w", what, v.MissingPVs, err)
	}
	if lv.Pool != "" {
		if p := rep.FindThinPool(vg, lv.Pool); p != nil && poolFull(p) {
			return nil, fmt.Errorf("%s: thin pool %s is full (data %.2f%%, metadata %.2f%%): %w", what, p.Name, p.DataPercent, p.MetadataPercent, err)
		}
	}
	return nil, fmt.Errorf("%s: %w", what, err)
}
