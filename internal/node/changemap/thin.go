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

// ParseThinDelta reads thin_delta's XML (thin-provisioning-tools 0.9;
// plain or --verbose) and returns the bytes where the right device may
// differ from the left: the ranges "different" (both map the block,
// not to the same data block), "right_only" (written since) and
// "left_only" (discarded since: reads zeros now), in the pool's blocks
// (superblock data_block_size, in 512-byte sectors). "same" ranges are
// left out.
func ParseThinDelta(r io.Reader) (Set, error) {
	const x = toolXML("thin_delta")
	dec := xml.NewDecoder(r)
	var set Set
	var block uint64
	var kind string // the enclosing range kind, in the --verbose form
	diffs := 0
	for {
		tok, err := x.next(dec)
		if errors.Is(err, io.EOF) {
			break
		}
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
				begin, err := x.uint(t, "begin")
				if err != nil {
					return nil, err
				}
				n, err := x.uint(t, "length")
				if err != nil {
					return nil, err
				}
				if set, err = x.add(set, t, begin, n, block); err != nil {
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

// Runner runs one command (no shell) and returns its standard output;
// a command that ran and failed is an error that carries its standard
// error. Exec is the real one.
type Runner interface {
	Run(ctx context.Context, cmd string, args ...string) ([]byte, error)
}

// Finder names changes from device-mapper metadata. Use one per node
// (it serializes the thin pools' metadata snapshots, of which a pool
// has at most one).
type Finder struct {
	// Run runs dmsetup and thin_delta.
	Run Runner
	// DevDir is where device nodes are (/dev, or DM_DEV_DIR).
	DevDir string
	// pools serializes the metadata snapshots.
	pools sync.Mutex
}

// releaseTimeout bounds the release of a metadata snapshot, which runs
// even when the caller's context has ended.
const releaseTimeout = 30 * time.Second

// ThinChanges names the bytes where the thin LV vol of vg may differ from its
// thin snapshot base, both active in pool: it reads their thin IDs from the
// device-mapper tables, reserves a metadata snapshot of the pool, compares the
// trees with thin_delta, and releases the snapshot it reserved. A pool holds
// one at most: one held already (another tool, or an agent killed in between)
// is ErrMetadataSnapHeld, which the caller takes for "compare instead"; its
// holder, or an administrator, releases it.
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

// ThinChangesOfIDs is ThinChanges between the thin devices of pool whose
// thin IDs LVM's metadata gives (lvm.Client.ThinID): neither device need
// be active, only the pool (PoolActive).
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

// ThinMapped names the bytes of the thin LV vol of vg (active, in pool)
// that map a pool block: what was written to it (or to its origin
// before it was taken) and not discarded since. Elsewhere it reads
// zeros. Like ThinChanges it reads a reserved metadata snapshot of the
// pool, with thin_dump, and always releases the snapshot it reserved.
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

// ThinMappedOfID is ThinMapped of the thin device of pool whose thin ID
// LVM's metadata gives: the device need not be active, only the pool.
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

// PoolActive tells whether the thin pool pool of vg is active: its pool
// device (the "-tpool" layer), which takes the metadata snapshot's
// messages, has a device node.
func (f *Finder) PoolActive(vg, pool string) bool {
	if checkName("volume group", vg) != nil || checkName("thin pool", pool) != nil {
		return false
	}
	st, err := os.Stat(path.Join(f.DevDir, "mapper", dmName(vg, pool, "tpool")))
	return err == nil && st.Mode()&os.ModeDevice != 0
}

// withMetadataSnap reserves the metadata snapshot of the thin pool pool
// of vg, runs read with the path of the pool's metadata device, and
// releases the snapshot, even when ctx has ended. A pool holds one
// snapshot at most, so the Finder runs one at a time.
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

// ErrMetadataSnapHeld: the pool's metadata snapshot is held already,
// by another program or by an agent that died holding it; carve does
// not release it.
var ErrMetadataSnapHeld = errors.New("the thin pool's metadata snapshot is held already")

// reserve reserves the metadata snapshot of the pool device tpool. A
// failure is never answered by a release: the pool's status tells
// whether a snapshot is held (ErrMetadataSnapHeld, naming how to
// release it) or the reserve failed for another reason.
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

// heldRoot is the block of the metadata snapshot the thin-pool device
// tpool holds, from its status ("<start> <length> thin-pool <transaction
// id> <used>/<total metadata> <used>/<total data> <held metadata root>
// ..."), or "" when it holds none ("-").
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

// thinID reads the device-mapper table of the thin device dev: its thin
// ID and its pool's device (major:minor).
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
