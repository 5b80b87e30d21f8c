package guestvm

import (
	"fmt"
	"io"
	"io/fs"
	"strings"
)

// cpioWriter writes the "newc" (SVR4, no CRC) cpio format that the Linux
// kernel unpacks as an initramfs. Every entry gets mtime 0 and owner root so
// that the same inputs give the same bytes (the cache key relies on it).
// Like bufio.Writer it keeps its first error: the entry methods return
// nothing, later entries are dropped, and Close returns that error.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w, ino: 1} }

// Mode bits of the newc header (they are the st_mode bits of Linux).
const (
	cpioDir     = 0o040000
	cpioRegular = 0o100000
	cpioSymlink = 0o120000
	cpioCharDev = 0o020000
)

// Dir adds a directory.
func (c *cpioWriter) Dir(name string, perm fs.FileMode) {
	c.entry(name, cpioDir|uint32(perm.Perm()), 0, 0, nil)
}

// File adds a regular file with its contents.
func (c *cpioWriter) File(name string, perm fs.FileMode, data []byte) {
	c.entry(name, cpioRegular|uint32(perm.Perm()), 0, 0, data)
}

// Symlink adds a symbolic link name -> target.
func (c *cpioWriter) Symlink(name, target string) {
	c.entry(name, cpioSymlink|0o777, 0, 0, []byte(target))
}

// CharDev adds a character device node; no privilege is needed to write it
// into an archive, the kernel creates the node when it unpacks.
func (c *cpioWriter) CharDev(name string, perm fs.FileMode, major, minor uint32) {
	c.entry(name, cpioCharDev|uint32(perm.Perm()), major, minor, nil)
}

// Close writes the trailer entry and returns the first error of any entry.
func (c *cpioWriter) Close() error {
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	return c.err
}

func (c *cpioWriter) entry(name string, mode, rdevMajor, rdevMinor uint32, data []byte) {
	if c.err != nil {
		return
	}
	name = strings.TrimPrefix(name, "/")
	if name == "" || strings.ContainsRune(name, 0) {
		c.err = fmt.Errorf("cpio: bad entry name %q", name)
		return
	}
	nlink := uint32(1)
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	ino := c.ino
	c.ino++
	if name == "TRAILER!!!" {
		ino, nlink = 0, 1
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize (with its NUL), check.
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	buf := make([]byte, 0, len(hdr)+len(name)+4)
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	if _, err := c.w.Write(buf); err != nil {
		c.err = err
		return
	}
	if len(data) > 0 {
		if _, err := c.w.Write(data); err != nil {
			c.err = err
			return
		}
		if n := len(data) % 4; n != 0 {
			if _, err := c.w.Write(make([]byte, 4-n)); err != nil {
				c.err = err
				return
			}
		}
	}
}

// pad4 pads b with NULs to a multiple of four bytes (header and name are
// aligned together, the header being 110 bytes).
func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
