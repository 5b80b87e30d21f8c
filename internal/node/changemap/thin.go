package changemap

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ParseThinDelta reads thin_delta's XML (thin-provisioning-tools 0.9) and
// returns where the right device may differ from the left, in pool blocks:
// "different", "right_only" (written since) and "left_only" (discarded
// since: reads zeros now).
func ParseThinDelta(r io.Reader) (Set, error) {
	const x = toolXML("thin_delta")
	var set Set
	var block uint64
	var kind string // the enclosing range kind, in the --verbose form
	diffs := 0
	for tok, err := range x.elements(r) {
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			switch t.Name.Local {
			case "superblock":
				if block, err = x.blockBytes(t); err != nil {
					return nil, err
				}
			case "diff":
				diffs++
			case "same", "different", "right_only", "left_only", "range":
				if t.Name.Local != "range" {
					kind = t.Name.Local
				}
				if !hasAttr(t, "begin") {
					continue // --verbose: the ranges follow inside
				}
				if block == 0 || diffs != 1 {
					return nil, x.errorf("<%s> outside one <diff> of a <superblock>", t.Name.Local)
				}
				if kind == "same" {
					continue
				}
				if set, err = x.add(set, t, "begin", "length", block); err != nil {
					return nil, err
				}
			default:
				return nil, x.errorf("unknown element <%s>", t.Name.Local)
			}
		case xml.EndElement:
			if t.Name.Local != "range" {
				kind = ""
			}
		}
	}
	if diffs != 1 {
		return nil, x.errorf("%d <diff> elements, want 1", diffs)
	}
	return set, nil
}

// Runner runs one command without a shell and returns its stdout; a failure
// carries its stderr.
type Runner interface {
	Run(ctx context.Context, cmd string, args ...string) ([]byte, error)
}

// Finder names changes from device-mapper metadata. Use one per node: it
// serializes the pools' metadata snapshots, of which a pool has at most one.
type Finder struct {
	Run    Runner
	DevDir string
	pools  sync.Mutex
}

// releaseTimeout bounds the release, which runs even after ctx ended.
const releaseTimeout = 30 * time.Second

// ThinChanges names where thin LV vol may differ from its thin snapshot base,
// both active in pool: thin IDs from the dm tables, then thin_delta over a
// reserved metadata snapshot, always released. A snapshot held already
// (another tool, or an agent killed in between) is ErrMetadataSnapHeld: the
// caller compares instead, and the holder or an administrator releases it.
func (f *Finder) ThinChanges(ctx context.Context, vg, pool, base, vol string) (set Set, err error) {
	for _, n := range []struct{ what, v string }{{"volume group", vg}, {"thin pool", pool}, {"base", base}, {"volume", vol}} {
		if err := checkName(n.what, n.v); err != nil {
			return nil, err
		}
	}
	baseID, basePool, err := f.thinID(ctx, dmName(vg, base, ""))
	if err != nil {
		return nil, err
	}
	volID, volPool, err := f.thinID(ctx, dmName(vg, vol, ""))
	if err != nil {
		return nil, err
	}
	if basePool != volPool {
		return nil, fmt.Errorf("%s/%s is in pool device %s, its base %s in %s", vg, vol, volPool, base, basePool)
	}
	return f.ThinChangesOfIDs(ctx, vg, pool, baseID, volID)
}

// ThinChangesOfIDs is ThinChanges by LVM's thin IDs: only the pool need be
// active.
func (f *Finder) ThinChangesOfIDs(ctx context.Context, vg, pool string, baseID, volID uint64) (set Set, err error) {
	for _, n := range []struct{ what, v string }{{"volume group", vg}, {"thin pool", pool}} {
		if err := checkName(n.what, n.v); err != nil {
			return nil, err
		}
	}
	err = f.withMetadataSnap(ctx, vg, pool, func(meta string) error {
		out, err := f.Run.Run(ctx, "thin_delta", "--metadata-snap", "--snap1", strconv.FormatUint(baseID, 10),
			"--snap2", strconv.FormatUint(volID, 10), meta)
		if err != nil {
			return fmt.Errorf("thin_delta of thin devices %d and %d of %s/%s: %w", baseID, volID, vg, pool, err)
		}
		set, err = ParseThinDelta(bytes.NewReader(out))
		return err
	})
	if err != nil {
		return nil, err
	}
	return set, nil
}

// ThinMapped names the bytes of thin LV vol that map a pool block (written,
// and not discarded since); elsewhere it reads zeros. It uses thin_dump
// over a reserved metadata snapshot, always released.
func (f *Finder) ThinMapped(ctx context.Context, vg, pool, vol string) (set Set, err error) {
	for _, n := range []struct{ what, v string }{{"volume group", vg}, {"thin pool", pool}, {"volume", vol}} {
		if err := checkName(n.what, n.v); err != nil {
			return nil, err
		}
	}
	id, _, err := f.thinID(ctx, dmName(vg, vol, ""))
	if err != nil {
		return nil, err
	}
	return f.ThinMappedOfID(ctx, vg, pool, id)
}

// ThinMappedOfID is ThinMapped by LVM's thin ID: only the pool need be
// active.
func (f *Finder) ThinMappedOfID(ctx context.Context, vg, pool string, id uint64) (set Set, err error) {
	for _, n := range []struct{ what, v string }{{"volume group", vg}, {"thin pool", pool}} {
		if err := checkName(n.what, n.v); err != nil {
			return nil, err
		}
	}
	err = f.withMetadataSnap(ctx, vg, pool, func(meta string) error {
		out, err := f.Run.Run(ctx, "thin_dump", "--metadata-snap", "--dev-id", strconv.FormatUint(id, 10), meta)
		if err != nil {
			return fmt.Errorf("thin_dump of thin device %d of %s/%s: %w", id, vg, pool, err)
		}
		set, err = ParseThinDump(bytes.NewReader(out), id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return set, nil
}

// PoolActive tells whether pool's "-tpool" device, which takes the metadata
// snapshot messages, has a device node.
func (f *Finder) PoolActive(vg, pool string) bool {
	if checkName("volume group", vg) != nil || checkName("thin pool", pool) != nil {
		return false
	}
	st, err := os.Stat(path.Join(f.DevDir, "mapper", dmName(vg, pool, "tpool")))
	return err == nil && st.Mode()&os.ModeDevice != 0
}

// withMetadataSnap runs read with pool's metadata device path under a
// reserved metadata snapshot, released even after ctx ended.
func (f *Finder) withMetadataSnap(ctx context.Context, vg, pool string, read func(meta string) error) (err error) {
	f.pools.Lock()
	defer f.pools.Unlock()
	tpool := dmName(vg, pool, "tpool")
	if err := f.reserve(ctx, tpool); err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if rerr := f.message(rctx, tpool, "release_metadata_snap"); rerr != nil && err == nil {
			err = fmt.Errorf("releasing the metadata snapshot of %s: %w", tpool, rerr)
		}
	}()
	return read(path.Join(f.DevDir, "mapper", dmName(vg, pool+"_tmeta", "")))
}

// ErrMetadataSnapHeld: another program, or a dead agent, holds the pool's
// metadata snapshot; carve does not release it.
var ErrMetadataSnapHeld = errors.New("the thin pool's metadata snapshot is held already")

// reserve reserves tpool's metadata snapshot. A failure is never answered by
// a release: the pool's status tells whether one is held.
func (f *Finder) reserve(ctx context.Context, tpool string) error {
	err := f.message(ctx, tpool, "reserve_metadata_snap")
	if err == nil {
		return nil
	}
	root, serr := f.heldRoot(ctx, tpool)
	switch {
	case serr != nil:
		return fmt.Errorf("reserving a metadata snapshot of %s: %w (and reading the pool's status: %w)", tpool, err, serr)
	case root != "":
		return fmt.Errorf("reserving a metadata snapshot of %s: %w (block %s): another program reads the pool's metadata (thin_ls, a backup), or a carve agent was killed before releasing its own; "+
			"carve releases only a snapshot it reserved, and names changes without thin_delta meanwhile; once no program reads it: dmsetup message %s 0 release_metadata_snap",
			tpool, ErrMetadataSnapHeld, root, tpool)
	}
	return fmt.Errorf("reserving a metadata snapshot of %s (none is held): %w", tpool, err)
}

// heldRoot is the held metadata root from tpool's status ("<start> <length>
// thin-pool <trans id> <meta> <data> <held root> ..."), "" for "-".
func (f *Finder) heldRoot(ctx context.Context, tpool string) (string, error) {
	out, err := f.Run.Run(ctx, "dmsetup", "status", tpool)
	if err != nil {
		return "", fmt.Errorf("the status of %s: %w", tpool, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) < 7 || fields[2] != "thin-pool" || strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
		return "", fmt.Errorf("the status of %s is not one thin-pool target: %q", tpool, out)
	}
	if fields[6] == "-" {
		return "", nil
	}
	if _, err := strconv.ParseUint(fields[6], 10, 64); err != nil {
		return "", fmt.Errorf("the status of %s: held metadata root %q: %w", tpool, fields[6], err)
	}
	return fields[6], nil
}

func (f *Finder) message(ctx context.Context, dev, msg string) error {
	if _, err := f.Run.Run(ctx, "dmsetup", "message", dev, "0", msg); err != nil {
		return fmt.Errorf("dmsetup message %s %s: %w", dev, msg, err)
	}
	return nil
}

func (f *Finder) thinID(ctx context.Context, dev string) (uint64, string, error) {
	out, err := f.Run.Run(ctx, "dmsetup", "table", dev)
	if err != nil {
		return 0, "", fmt.Errorf("the table of %s: %w", dev, err)
	}
	// One target: "<start> <length> thin <pool dev> <dev id> [<external origin>]".
	fields := strings.Fields(string(out))
	if len(fields) < 5 || fields[2] != "thin" || strings.Count(string(out), "\n") > 1 {
		return 0, "", fmt.Errorf("the table of %s is not one thin target: %q", dev, out)
	}
	if len(fields) > 5 {
		return 0, "", fmt.Errorf("%s has an external origin (%q): its unmapped blocks are not zeros", dev, out)
	}
	id, err := strconv.ParseUint(fields[4], 10, 32)
	if err != nil {
		return 0, "", fmt.Errorf("the table of %s: thin ID %q: %w", dev, fields[4], err)
	}
	return id, fields[3], nil
}
