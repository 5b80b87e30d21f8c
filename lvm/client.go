// Package lvm runs lvm2 commands for carve: without a shell, with LC_ALL=C,
// a deadline on every call, JSON reports decoded into typed structs, typed
// errors, and mutations serialized per volume group.
package lvm

import (
	"context"
	"errors"
	"time"
)

// Options configure a Client. The zero value is usable.
type Options struct {
	// Command is the lvm binary; default "lvm" from PATH.
	Command string
	// Env is added to the environment of every command (LVM_SYSTEM_DIR from
	// the caller's environment is kept as it is).
	Env []string
	// Timeout bounds every command that has no earlier context deadline;
	// default 2 minutes.
	Timeout time.Duration
	// Observer, when set, receives every command's duration.
	Observer Observer
}

// Client runs lvm2 commands. It is safe for concurrent use: mutations of one
// volume group are serialized, reads run concurrently.
type Client struct {
	opts Options
}

// New returns a Client.
func New(opts Options) *Client { return &Client{opts: opts} }

var errNotImplemented = errors.New("not implemented")

// Report reads all volume groups, logical volumes and thin pools with one
// lvm command.
func (c *Client) Report(ctx context.Context) (*Report, error) { return nil, errNotImplemented }

// VolumeGroup returns one volume group; ErrNotFound when it does not exist.
func (c *Client) VolumeGroup(ctx context.Context, vg string) (*VolumeGroup, error) {
	return nil, errNotImplemented
}

// ListLVs lists the LVs of a volume group (all VGs when vg is empty).
func (c *Client) ListLVs(ctx context.Context, vg string) ([]LogicalVolume, error) {
	return nil, errNotImplemented
}

// FindByTag returns the LVs that carry tag (in any VG when vg is empty).
// No match is an empty slice, not an error.
func (c *Client) FindByTag(ctx context.Context, vg, tag string) ([]LogicalVolume, error) {
	return nil, errNotImplemented
}

// GetLV returns one LV; ErrNotFound when it does not exist.
func (c *Client) GetLV(ctx context.Context, vg, name string) (*LogicalVolume, error) {
	return nil, errNotImplemented
}

// CreateLV creates a thick or thin LV. ErrAlreadyExists when the name is
// taken, ErrInsufficientSpace when the VG (or the pool) cannot hold it,
// ErrInvalidArgument for a bad name, tag, size or option.
func (c *Client) CreateLV(ctx context.Context, req CreateRequest) (*LogicalVolume, error) {
	return nil, errNotImplemented
}

// CreateThinSnapshot creates a thin snapshot named name of the thin LV origin.
func (c *Client) CreateThinSnapshot(ctx context.Context, vg, origin, name string, tags []string) (*LogicalVolume, error) {
	return nil, errNotImplemented
}

// ExtendLV grows an LV to at least size bytes (rounded up to extents). An LV
// that is already that large is returned unchanged.
func (c *Client) ExtendLV(ctx context.Context, vg, name string, size uint64) (*LogicalVolume, error) {
	return nil, errNotImplemented
}

// RemoveLV removes an LV; ErrNotFound when it does not exist.
func (c *Client) RemoveLV(ctx context.Context, vg, name string) error { return errNotImplemented }
