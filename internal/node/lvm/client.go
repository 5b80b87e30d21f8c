// Package lvm runs lvm2 commands for carve: no shell, LC_ALL=C, a deadline
// on every call, JSON reports decoded into typed structs, typed errors, and
// mutations serialized per volume group. Names and tags are validated before
// any command runs. On success CreateLV and RemoveLV are one lvm command,
// their result built from the request and the cached extent size; a failure
// costs an extra read, to tell why.
package lvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/carve-csi/carve/internal/lvmname"
)

// Options configure a Client; the zero value is usable.
type Options struct {
	// Command is the lvm binary; default "lvm" from PATH.
	Command string
	// Env is added to every command's environment.
	Env []string
	// Timeout bounds every command without an earlier deadline; default 2m.
	Timeout  time.Duration
	Observer Observer
}

// Client runs lvm2 commands; safe for concurrent use.
type Client struct {
	opts      Options
	runner    runner
	timeout   time.Duration
	observer  Observer
	devDir    string
	locks     VGLocks
	running   sync.WaitGroup
	hungGrace time.Duration

	mu sync.Mutex
	// extents caches each VG's extent size, fixed at vgcreate.
	extents map[string]uint64
}

// New returns a Client.
func New(opts Options) *Client {
	if opts.Command == "" {
		opts.Command = defaultCommand
	}
	env := commandEnv(opts.Env)
	return newClient(opts, execRunner{command: opts.Command, env: env}, env)
}

func newClient(opts Options, r runner, env []string) *Client {
	c := &Client{opts: opts, runner: r, timeout: opts.Timeout, observer: opts.Observer,
		devDir: "/dev", extents: map[string]uint64{}, hungGrace: hungGrace}
	if c.timeout <= 0 {
		c.timeout = defaultTimeout
	}
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "DM_DEV_DIR="); ok && v != "" {
			c.devDir = v
		}
	}
	return c
}

// ControlNode is the device-mapper control node, under $DM_DEV_DIR.
func (c *Client) ControlNode() string { return path.Join(c.devDir, "mapper", "control") }

func (c *Client) lvPath(vg, lv string) string { return path.Join(c.devDir, vg, lv) }

func (c *Client) remember(vgs []VolumeGroup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, vg := range vgs {
		if vg.ExtentSize > 0 {
			c.extents[vg.Name] = vg.ExtentSize
		}
	}
}

func (c *Client) extentSize(ctx context.Context, vg string) (uint64, error) {
	c.mu.Lock()
	ext, ok := c.extents[vg]
	c.mu.Unlock()
	if ok {
		return ext, nil
	}
	v, err := c.VolumeGroup(ctx, vg)
	if err != nil {
		return 0, err
	}
	return v.ExtentSize, nil
}

// Report reads the named volume groups (all when none), their LVs (internal
// ones too) and thin pools with one command. Naming them keeps a foreign,
// unreadable VG from failing the report. A single missing named group is
// ErrVolumeGroupNotFound, decided by a read of the group, not the message.
func (c *Client) Report(ctx context.Context, vgs ...string) (*Report, error) {
	for _, vg := range vgs {
		if err := lvmname.VG(vg); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	out, err := c.run(ctx, fullReportArgs(vgs...)...)
	if err != nil {
		if len(vgs) == 1 {
			err = c.lvsFailed(ctx, vgs[0], err)
		}
		return nil, fmt.Errorf("reading LVM state: %w", err)
	}
	r, err := parseReport(out)
	if err != nil {
		return nil, err
	}
	r.ReadAt = start
	c.remember(r.VolumeGroups)
	return r, nil
}

// VolumeGroup returns one volume group; ErrVolumeGroupNotFound.
func (c *Client) VolumeGroup(ctx context.Context, vg string) (*VolumeGroup, error) {
	if err := lvmname.VG(vg); err != nil {
		return nil, err
	}
	out, err := c.run(ctx, vgsArgs(vg)...)
	if err != nil {
		return nil, fmt.Errorf("reading volume group %s: %w", vg, err)
	}
	r, err := parseReport(out)
	if err != nil {
		return nil, err
	}
	c.remember(r.VolumeGroups)
	v := r.FindVG(vg)
	if v == nil {
		return nil, fmt.Errorf("%s: %w", vg, ErrVolumeGroupNotFound)
	}
	return v, nil
}

// lvsFailed tells a missing vg by reading it, not by the message.
func (c *Client) lvsFailed(ctx context.Context, vg string, err error) error {
	if vg == "" || ctx.Err() != nil {
		return err
	}
	if _, vgErr := c.VolumeGroup(ctx, vg); vgErr != nil && errors.Is(vgErr, ErrVolumeGroupNotFound) {
		return fmt.Errorf("%s: %w", vg, ErrVolumeGroupNotFound)
	}
	return err
}

// ListLVs lists the LVs of vg (all VGs when empty), internal ones included.
func (c *Client) ListLVs(ctx context.Context, vg string) ([]LogicalVolume, error) {
	var rest []string
	if vg != "" {
		if err := lvmname.VG(vg); err != nil {
			return nil, err
		}
		rest = append(rest, vg)
	}
	out, err := c.run(ctx, lvsArgs(true, rest...)...)
	if err != nil {
		return nil, c.lvsFailed(ctx, vg, fmt.Errorf("listing logical volumes: %w", err))
	}
	return parseLVs(out)
}

// FindByTag returns the LVs carrying tag; none is an empty slice.
func (c *Client) FindByTag(ctx context.Context, vg, tag string) ([]LogicalVolume, error) {
	if err := lvmname.Tag(tag); err != nil {
		return nil, err
	}
	if vg != "" {
		if err := lvmname.VG(vg); err != nil {
			return nil, err
		}
	}
	// "@tag" also names every LV of a VG carrying the tag; LVM has no "tag
	// within VG" argument, so both are filtered here.
	out, err := c.run(ctx, lvsArgs(false, "@"+tag)...)
	if err != nil {
		return nil, fmt.Errorf("finding logical volumes tagged %s: %w", tag, err)
	}
	lvs, err := parseLVs(out)
	if err != nil {
		return nil, err
	}
	lvs = slices.DeleteFunc(lvs, func(lv LogicalVolume) bool {
		return vg != "" && lv.VolumeGroup != vg || !slices.Contains(lv.Tags, tag)
	})
	if lvs == nil {
		lvs = []LogicalVolume{}
	}
	return lvs, nil
}

// GetLV returns one LV; ErrNotFound, or ErrVolumeGroupNotFound.
func (c *Client) GetLV(ctx context.Context, vg, name string) (*LogicalVolume, error) {
	if err := validateLV(vg, name); err != nil {
		return nil, err
	}
	// A selection makes a missing LV an empty report, not a message.
	out, err := c.run(ctx, lvsArgs(false, "-S", fmt.Sprintf("lv_name=%q", name), vg)...)
	if err != nil {
		return nil, c.lvsFailed(ctx, vg, fmt.Errorf("reading logical volume %s/%s: %w", vg, name, err))
	}
	lvs, err := parseLVs(out)
	if err != nil {
		return nil, err
	}
	for i := range lvs {
		if lvs[i].VolumeGroup == vg && lvs[i].Name == name {
			return &lvs[i], nil
		}
	}
	return nil, fmt.Errorf("logical volume %s/%s: %w", vg, name, ErrNotFound)
}

// ThinID is the thin device ID the pool's metadata knows vg/name by
// (thin_delta --snap1, thin_dump --dev-id), read without activating it.
// ErrNotFound; an error when it is not one thin segment.
func (c *Client) ThinID(ctx context.Context, vg, name string) (uint64, error) {
	if err := validateLV(vg, name); err != nil {
		return 0, err
	}
	args := append([]string{"lvs"}, reportFlags...)
	out, err := c.run(ctx, append(args, "-o", "lv_name,thin_id", "-S", fmt.Sprintf("lv_name=%q", name), vg)...)
	if err != nil {
		return 0, c.lvsFailed(ctx, vg, fmt.Errorf("reading the thin ID of %s/%s: %w", vg, name, err))
	}
	return parseThinID(out, vg, name)
}

func parseThinID(out []byte, vg, name string) (uint64, error) {
	var r struct {
		Report []struct {
			LV []struct {
				Name   string `json:"lv_name"`
				ThinID string `json:"thin_id"`
			} `json:"lv"`
		} `json:"report"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("the thin ID of %s/%s: %w", vg, name, err)
	}
	var rows []string
	for _, rep := range r.Report {
		for _, lv := range rep.LV {
			if lv.Name == name {
				rows = append(rows, lv.ThinID)
			}
		}
	}
	switch {
	case len(rows) == 0:
		return 0, fmt.Errorf("logical volume %s/%s: %w", vg, name, ErrNotFound)
	case len(rows) > 1 || rows[0] == "":
		return 0, fmt.Errorf("%s/%s is not one thin segment (thin_id %q)", vg, name, rows)
	}
	id, err := strconv.ParseUint(rows[0], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("the thin ID of %s/%s: %w", vg, name, err)
	}
	return id, nil
}
