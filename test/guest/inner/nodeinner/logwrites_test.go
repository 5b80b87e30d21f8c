//go:build guestinner

package nodeinner

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
)

// A dm-log-writes log (the kernel's drivers/md/dm-log-writes.c and
// Documentation/admin-guide/device-mapper/log-writes.rst): a super block
// in the first sector, then one entry per logged write, flush, discard or
// mark, each a sector of its own followed by the write's data. The target
// logs a plain write only once a FLUSH that covers it has completed (a FUA
// write at once), so the log is the order in which writes became durable:
// a write still in the disk's cache when a mark is made comes after the
// mark.

const (
	logFlush    = 1 << 0
	logFUA      = 1 << 1
	logDiscard  = 1 << 2
	logMark     = 1 << 3
	logMetadata = 1 << 4

	logMagic   = 0x6a736677736872
	logVersion = 1
	// logEntryHeader is the size of struct log_write_entry: sector,
	// nr_sectors, flags, data_len, each a little-endian uint64.
	logEntryHeader = 32
)

// logEntry is one entry of the log.
type logEntry struct {
	// Sector and Sectors are where the write went on the logged device,
	// in units of the log's sector size.
	Sector, Sectors uint64
	Flags           uint64
	// Mark is a mark's name.
	Mark string
	// dataAt is where the write's data starts in the log file.
	dataAt int64
}

func (e logEntry) isWrite() bool { return e.Flags&(logMark|logDiscard) == 0 && e.Sectors > 0 }

// writeLog is a parsed log.
type writeLog struct {
	f          *os.File
	sectorSize int64
	entries    []logEntry
}

// readWriteLog parses the log held in path (the log device or its backing
// file). The log must be complete: the target removed, so that its super
// block counts every entry.
func readWriteLog(path string) (*writeLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	l, err := parseWriteLog(f)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", path, err), f.Close())
	}
	return l, nil
}

func parseWriteLog(f *os.File) (*writeLog, error) {
	var super [28]byte
	if _, err := f.ReadAt(super[:], 0); err != nil {
		return nil, fmt.Errorf("reading the super block: %w", err)
	}
	le := binary.LittleEndian
	if m := le.Uint64(super[0:]); m != logMagic {
		return nil, fmt.Errorf("magic %#x, want %#x: not a dm-log-writes log", m, logMagic)
	}
	if v := le.Uint64(super[8:]); v != logVersion {
		return nil, fmt.Errorf("log version %d, want %d", v, logVersion)
	}
	n := le.Uint64(super[16:])
	l := &writeLog{f: f, sectorSize: int64(le.Uint32(super[24:]))}
	if l.sectorSize < 512 || l.sectorSize&(l.sectorSize-1) != 0 {
		return nil, fmt.Errorf("sector size %d", l.sectorSize)
	}
	buf := make([]byte, l.sectorSize)
	at := l.sectorSize
	for i := uint64(0); i < n; i++ {
		if _, err := f.ReadAt(buf, at); err != nil {
			return nil, fmt.Errorf("entry %d of %d at byte %d: %w", i, n, at, err)
		}
		e := logEntry{Sector: le.Uint64(buf[0:]), Sectors: le.Uint64(buf[8:]), Flags: le.Uint64(buf[16:])}
		dataLen := le.Uint64(buf[24:])
		at += l.sectorSize
		switch {
		case e.Flags&logMark != 0:
			if dataLen > uint64(l.sectorSize-logEntryHeader) {
				return nil, fmt.Errorf("entry %d: a mark of %d bytes", i, dataLen)
			}
			e.Mark = string(buf[logEntryHeader : logEntryHeader+dataLen])
		case e.Flags&logDiscard == 0:
			e.dataAt = at
			at += int64(e.Sectors) * l.sectorSize
		}
		l.entries = append(l.entries, e)
	}
	return l, nil
}

// Close closes the log file.
func (l *writeLog) Close() error { return l.f.Close() }

// mark is the index of the entry of the mark name, or -1.
func (l *writeLog) mark(name string) int {
	for i, e := range l.entries {
		if e.Flags&logMark != 0 && e.Mark == name {
			return i
		}
	}
	return -1
}

// span is a byte range [from, to) of the logged device.
type span struct{ from, to int64 }

// bytes is where entry e wrote, in bytes of the logged device.
func (l *writeLog) bytes(e logEntry) span {
	return span{int64(e.Sector) * l.sectorSize, int64(e.Sector+e.Sectors) * l.sectorSize}
}

// nonZero counts the non-zero bytes entry e wrote inside s.
func (l *writeLog) nonZero(e logEntry, s span) (int64, error) {
	w := l.bytes(e)
	from, to := max(w.from, s.from), min(w.to, s.to)
	if from >= to {
		return 0, nil
	}
	buf := make([]byte, to-from)
	if _, err := l.f.ReadAt(buf, e.dataAt+(from-w.from)); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	var n int64
	for _, b := range buf {
		if b != 0 {
			n++
		}
	}
	return n, nil
}

// spans is a set of byte ranges.
type spans []span

// add adds s, keeping the set sorted and merged.
func (ss spans) add(s span) spans {
	if s.from >= s.to {
		return ss
	}
	ss = append(ss, s)
	sort.Slice(ss, func(i, j int) bool { return ss[i].from < ss[j].from })
	out := ss[:1]
	for _, x := range ss[1:] {
		if last := &out[len(out)-1]; x.from <= last.to {
			last.to = max(last.to, x.to)
		} else {
			out = append(out, x)
		}
	}
	return out
}

// intersect is the part of ss inside s.
func (ss spans) intersect(s span) spans {
	var out spans
	for _, x := range ss {
		out = out.add(span{max(x.from, s.from), min(x.to, s.to)})
	}
	return out
}

// size is the number of bytes in the set.
func (ss spans) size() int64 {
	var n int64
	for _, s := range ss {
		n += s.to - s.from
	}
	return n
}

// replay writes the log's writes before entry end onto a new file of
// size bytes at path: the device as a power cut right then leaves it,
// with what was durable (logged before end) and nothing that was still
// in the cache. A discard reads as zeros.
func (l *writeLog) replay(path string, size int64, end int) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	var buf []byte
	for _, e := range l.entries[:end] {
		if err != nil {
			break
		}
		b := l.bytes(e)
		switch {
		case e.Flags&logDiscard != 0 && e.Sectors > 0:
			_, err = f.WriteAt(make([]byte, b.to-b.from), b.from)
		case e.isWrite():
			if n := int(b.to - b.from); cap(buf) < n {
				buf = make([]byte, n)
			}
			data := buf[:b.to-b.from]
			if _, err = l.f.ReadAt(data, e.dataAt); err == nil {
				_, err = f.WriteAt(data, b.from)
			}
		}
	}
	return errors.Join(err, f.Close())
}
