//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// loggedVG is a volume group whose only PV is a dm-log-writes target:
// every write that reaches the PV is logged, in the order in which it
// became durable (see logwrites_test.go), on a second loop device.
type loggedVG struct {
	vg *lvmtest.LoopVG
	// dm is the log-writes target's device-mapper name; logFile the
	// backing file of its log device.
	dm, logFile string
}

// newLoggedVG makes a loggedVG of size bytes (4 MiB extents) with its
// files in dir, and removes it all when the test ends.
func newLoggedVG(t *testing.T, dir, name string, size int64) *loggedVG {
	t.Helper()
	ctx := context.Background()
	if _, err := plugintest.Run(ctx, "modprobe", "dm-log-writes"); err != nil {
		t.Fatal(err)
	}
	loop := func(file string, size int64) string {
		f, err := os.Create(filepath.Join(dir, file))
		if err == nil {
			err = f.Truncate(size) // sparse
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		return attachLoop(ctx, t, f.Name())
	}
	// The log holds every write's data: the zeroing of the volumes, LVM's
	// metadata and the pool's.
	data, logDev := loop("data.img", size), loop("log.img", 4*size)
	l := &loggedVG{dm: lvmtest.UniqueName("carvelw"), logFile: filepath.Join(dir, "log.img")}
	table := fmt.Sprintf("0 %d log-writes %s %s", size/512, data, logDev)
	if _, err := plugintest.Run(ctx, "dmsetup", "create", l.dm, "--table", table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Gone already when the test read the log.
		_, _ = plugintest.Run(context.Background(), "dmsetup", "remove", l.dm)
	})
	pv := "/dev/mapper/" + l.dm
	cfg := filepath.Join(dir, name+"-lvm")
	// As lvmtest's lvm.conf, with the log-writes target as the only PV:
	// the loop device under it carries the same PV label.
	writeOnePVConfig(t, cfg, pv)
	l.vg = &lvmtest.LoopVG{Name: name, ConfigDir: cfg, Devices: []string{pv}, Activation: true}
	if _, err := l.vg.LVM(ctx, "pvcreate", "--yes", pv); err != nil {
		t.Fatal(err)
	}
	if _, err := l.vg.LVM(ctx, "vgcreate", "--yes", "--physicalextentsize", "4m", name, pv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Deactivated already when the test read the log.
		_, _ = l.vg.LVM(context.Background(), "vgchange", "--activate", "n", name)
	})
	return l
}

// mark puts a mark named name in the log.
func (l *loggedVG) mark(t *testing.T, name string) {
	t.Helper()
	if _, err := plugintest.Run(context.Background(), "dmsetup", "message", l.dm, "0", "mark", name); err != nil {
		t.Fatal(err)
	}
}

// flush sends a FLUSH to the PV (fsync of the block device): the writes
// that were still in the cache reach the log, before the next mark.
func (l *loggedVG) flush(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/dev/mapper/"+l.dm, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// finish deactivates the volume group and removes the log-writes target,
// which completes the log, and returns it parsed.
func (l *loggedVG) finish(t *testing.T) *writeLog {
	t.Helper()
	ctx := context.Background()
	if _, err := l.vg.LVM(ctx, "vgchange", "--activate", "n", l.vg.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := plugintest.Run(ctx, "dmsetup", "remove", l.dm); err != nil {
		t.Fatal(err)
	}
	wl, err := readWriteLog(l.logFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := wl.Close(); err != nil {
			t.Error(err)
		}
	})
	return wl
}

// pvSpans is where LV lv lies on the PV, in bytes, in the LV's order.
func (l *loggedVG) pvSpans(t *testing.T, lv string) spans {
	t.Helper()
	ctx := context.Background()
	num := func(out []byte, err error) int64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	peStart := num(l.vg.LVM(ctx, "pvs", "--noheadings", "--units", "b", "--nosuffix", "-o", "pe_start", l.vg.Devices[0]))
	extent := num(l.vg.LVM(ctx, "vgs", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_extent_size", l.vg.Name))
	out, err := l.vg.LVM(ctx, "lvs", "-a", "--noheadings", "-o", "seg_pe_ranges", l.vg.Name+"/"+lv)
	if err != nil {
		t.Fatal(err)
	}
	var ss []span // not merged: the LV's order matters (lvSpan)
	for _, r := range strings.Fields(string(out)) {
		i := strings.LastIndexByte(r, ':')
		first, last, ok := strings.Cut(r[i+1:], "-")
		a, err1 := strconv.ParseInt(first, 10, 64)
		b, err2 := strconv.ParseInt(last, 10, 64)
		if i < 0 || !ok || err1 != nil || err2 != nil {
			t.Fatalf("seg_pe_ranges of %s: %q", lv, out)
		}
		ss = append(ss, span{peStart + a*extent, peStart + (b+1)*extent})
	}
	if len(ss) == 0 {
		t.Fatalf("%s lies nowhere: seg_pe_ranges %q", lv, out)
	}
	return ss
}

// lvSpan maps [from, to) of an LV that lies on segs (pvSpans) to PV bytes.
func lvSpan(segs spans, from, to int64) spans {
	var out spans
	var at int64
	for _, s := range segs {
		n := s.to - s.from
		out = out.add(span{s.from + max(from-at, 0), s.from + min(to-at, n)})
		at += n
	}
	return out
}

// TestZeroingIsFlushedBeforeCreateVolumeAnswers: the zeros a new volume
// gets (the whole of a thick raw-block volume, the signature regions of a
// thick filesystem volume) are on the disk, not in its write cache, when
// CreateVolume answers: a power cut after the answer must not bring the
// previous tenant's bytes back (review N3). The volume group's PV is a
// dm-log-writes target, which logs a write only once a FLUSH (or its own
// FUA) made it durable; a mark goes in the log when CreateVolume has
// answered, and an explicit FLUSH and a second mark right after it. Every
// zeroing write must be in the log before the first mark, and nothing the
// call wrote to the volume's extents between the two. A thick volume of a
// class with `erase: none` (nothing zeroed) and a thin volume (nothing
// zeroed: the pool zeroes new blocks; checked on its pool's data and
// metadata LVs) are checked the same way. Then each answer is replayed as
// a power cut (checkPowerCut): the volume must be there (lvm2 writes its
// metadata without a FLUSH) and show nothing of a previous tenant.
func TestZeroingIsFlushedBeforeCreateVolumeAnswers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l := newLoggedVG(t, dir, "flush", 384*mib)
	if err := l.vg.CreateThinPool(context.Background(), "pool0", 64*mib); err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, l.vg, dir, "  - {name: thin, volumeGroup: $VG, thinPool: pool0, overprovisionRatio: 4}\n"+
		"  - {name: kept, volumeGroup: $VG, erase: none}\n", nil)
	type result struct {
		name, class string
		lv          string
		// zeroed is what CreateVolume must zero, where is every PV byte
		// of the volume (for thin: of its pool).
		zeroed, where spans
	}
	var results []result
	// The previous tenant: a thick raw-block volume written whole with a
	// pattern and deleted, whose extents the first new volume gets.
	prev := e.createInClass("previous-tenant", eraseSize, blockCapability(), class)
	dev := plugintest.MustDevicePath(t, prev)
	writeDevice(t, dev, pattern)
	prevAt := l.pvSpans(t, lvName(t, prev))
	e.delete(prev)
	for _, tc := range []struct {
		name, class string
		capability  *csi.VolumeCapability
	}{
		{"thick-block", class, blockCapability()},
		{"thick-filesystem", class, plugintest.MountCapability("ext4")},
		{"thick-block-kept", "kept", blockCapability()},
		{"thin-block", "thin", blockCapability()},
	} {
		l.mark(t, "before-"+tc.name)
		id := e.createInClass(tc.name, eraseSize, tc.capability, tc.class)
		l.mark(t, "answered-"+tc.name)
		l.flush(t)
		l.mark(t, "flushed-"+tc.name)
		r := result{name: tc.name, class: tc.class, lv: lvName(t, id)}
		switch tc.name {
		case "thick-block":
			r.where = l.pvSpans(t, r.lv)
			r.zeroed = lvSpan(r.where, 0, eraseSize)
			if fmt.Sprint(r.where) != fmt.Sprint(prevAt) {
				t.Fatalf("the new volume lies on %v, the previous tenant's on %v: the test needs the same extents", r.where, prevAt)
			}
		case "thick-filesystem":
			r.where = l.pvSpans(t, r.lv)
			r.zeroed = append(lvSpan(r.where, 0, signatureHead), lvSpan(r.where, eraseSize-signatureTail, eraseSize)...)
		case "thick-block-kept":
			r.where = l.pvSpans(t, r.lv) // nothing zeroed (erase: none), but the LV must survive
		default:
			for _, lv := range []string{"pool0_tdata", "pool0_tmeta"} {
				for _, s := range l.pvSpans(t, lv) {
					r.where = r.where.add(s)
				}
			}
		}
		results = append(results, r)
	}
	// The volumes stay: the plugin stops first (createVolume's cleanups
	// then delete nothing), and the log ends here.
	e.stop()
	wl := l.finish(t)
	fmt.Printf("FLUSH log of %d entries, sector size %d\n", len(wl.entries), wl.sectorSize)
	for _, r := range results {
		checkFlushed(t, wl, r.name, r.zeroed, r.where)
		checkPowerCut(t, wl, dir, r.name, r.lv, r.zeroed)
	}
}

// checkPowerCut replays the log up to the answer of CreateVolume name
// (writeLog.replay: the disk as a power cut right after the answer leaves
// it) and checks what a user of the volume would then find: the volume
// is there (LVM on the replayed disk lists LV lv), and where CreateVolume
// zeroes it reads zeros, not the previous tenant's pattern.
func checkPowerCut(t *testing.T, wl *writeLog, dir, name, lv string, zeroed spans) {
	t.Helper()
	ctx := context.Background()
	img := filepath.Join(dir, "replay-"+name+".img")
	size, err := os.Stat(filepath.Join(dir, "data.img"))
	if err != nil {
		t.Fatal(err)
	}
	if err := wl.replay(img, size.Size(), wl.mark("answered-"+name)); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.Remove(img); err != nil {
			t.Error(err)
		}
	}()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	var old int64
	for _, z := range zeroed {
		buf := make([]byte, z.to-z.from)
		if _, err := f.ReadAt(buf, z.from); err != nil {
			t.Fatal(err)
		}
		old += int64(bytes.Count(buf, pattern[:8]))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// LVM reads the replayed disk through a loop device and an lvm.conf
	// of its own that sees nothing else (the data disk has the same PV).
	loop, err := plugintest.Run(ctx, "losetup", "--find", "--show", "--read-only", img)
	if err != nil {
		t.Fatal(err)
	}
	loop = strings.TrimSpace(loop)
	defer func() {
		if _, err := plugintest.Run(context.Background(), "losetup", "--detach", loop); err != nil {
			t.Error(err)
		}
	}()
	cfg := filepath.Join(dir, "replay-lvm")
	if err := os.MkdirAll(cfg, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("devices {\n\tglobal_filter = [ \"a|^%s$|\", \"r|.*|\" ]\n\tuse_devicesfile = 0\n\tobtain_device_list_from_udev = 0\n\thints = \"none\"\n}\nglobal {\n\tactivation = 0\n}\n", loop)
	if err := os.WriteFile(filepath.Join(cfg, "lvm.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	replayed := &lvmtest.LoopVG{Name: "flush", ConfigDir: cfg}
	out, err := replayed.LVM(ctx, "lvs", "--noheadings", "-o", "lv_name", "flush")
	listed := err == nil && slices.Contains(strings.Fields(string(out)), lv)
	fmt.Printf("FLUSH %s after a power cut at the answer: LV listed %v, %d bytes of the previous tenant's pattern where it was zeroed\n", name, listed, old*8)
	if !listed {
		t.Errorf("%s: after a power cut right after CreateVolume answered, LVM does not list %s (%q, %v): the volume was lost", name, lv, out, err)
	}
	if old != 0 {
		t.Errorf("%s: after a power cut right after CreateVolume answered, the volume shows %d bytes of the previous tenant's data", name, old*8)
	}
}

// checkFlushed checks one CreateVolume of TestZeroingIsFlushedBeforeCreateVolumeAnswers
// in the log: zeroed all written, zeros, and durable before the answer;
// nothing written to where left in the cache at the answer.
func checkFlushed(t *testing.T, wl *writeLog, name string, zeroed, where spans) {
	t.Helper()
	before, answered, flushed := wl.mark("before-"+name), wl.mark("answered-"+name), wl.mark("flushed-"+name)
	if before < 0 || answered < before || flushed < answered {
		t.Fatalf("%s: marks at entries %d, %d, %d: not in the log in order", name, before, answered, flushed)
	}
	var durable spans
	var writes, nonZero int64
	lastWrite, flushAfter := -1, -1
	var durableElsewhere, lateElsewhere int64
	for i := before + 1; i < answered; i++ {
		en := wl.entries[i]
		if en.Flags&(logFlush|logFUA) != 0 && lastWrite >= 0 && flushAfter < lastWrite {
			flushAfter = i
		}
		if !en.isWrite() {
			continue
		}
		b := wl.bytes(en)
		on := spans{}.add(b)
		hit := false
		for _, w := range where {
			if x := on.intersect(w); len(x) > 0 {
				hit = true
				durable = append(durable, x...)
			}
		}
		if !hit {
			durableElsewhere += b.to - b.from
			continue
		}
		writes++
		lastWrite = i
		if en.Flags&logFUA != 0 {
			flushAfter = i
		}
		for _, z := range zeroed {
			n, err := wl.nonZero(en, z)
			if err != nil {
				t.Fatal(err)
			}
			nonZero += n
		}
	}
	var merged spans
	for _, s := range durable {
		merged = merged.add(s)
	}
	var missing int64
	for _, z := range zeroed {
		missing += (z.to - z.from) - merged.intersect(z).size()
	}
	var late spans
	for i := answered + 1; i < flushed; i++ {
		en := wl.entries[i]
		if !en.isWrite() {
			continue
		}
		b := wl.bytes(en)
		hit := false
		for _, w := range where {
			if x := (spans{}).add(b).intersect(w); len(x) > 0 {
				hit = true
				for _, s := range x {
					late = late.add(s)
				}
			}
		}
		if !hit {
			lateElsewhere += b.to - b.from
		}
	}
	var want int64
	for _, z := range zeroed {
		want += z.to - z.from
	}
	fmt.Printf("FLUSH %s: %d of %d bytes to zero durable at the answer (%d writes to the volume, last at entry %d, FLUSH/FUA at entry %d, answer at %d); "+
		"in the cache at the answer: %d bytes of the volume, %d elsewhere (LVM metadata: %d bytes durable)\n",
		name, want-missing, want, writes, lastWrite, flushAfter, answered, late.size(), lateElsewhere, durableElsewhere)
	if missing != 0 {
		t.Errorf("%s: %d of the %d bytes CreateVolume zeroes were not durable when it answered (no FLUSH after the zeroing)", name, missing, want)
	}
	if nonZero != 0 {
		t.Errorf("%s: CreateVolume wrote %d non-zero bytes where it zeroes", name, nonZero)
	}
	if lastWrite >= 0 && flushAfter < lastWrite {
		t.Errorf("%s: no FLUSH or FUA after CreateVolume's last write to the volume (entry %d)", name, lastWrite)
	}
	if late.size() != 0 {
		t.Errorf("%s: CreateVolume answered with %d bytes of its writes to the volume still in the disk's cache", name, late.size())
	}
}
