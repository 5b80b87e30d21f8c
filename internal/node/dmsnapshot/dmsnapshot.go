// Package dmsnapshot reads a device-mapper copy-on-write snapshot's state
// from the kernel (DM_TABLE_STATUS) without running lvm, whose device scan
// costs about a quarter second on a slow node: a thick restore reads it once
// after its copy, to know the snapshot did not overflow meanwhile.
package dmsnapshot

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// State is what the kernel reports of a device.
type State struct {
	Snapshot bool
	// Invalid: the snapshot ran out of copy-on-write space (or is full), or a
	// merge failed; it can no longer be read.
	Invalid bool
	// Status is the target's status line as dmsetup status prints it.
	Status string
}

// Reader reads through one control node.
type Reader struct {
	// Control is the device-mapper control node (under DM_DEV_DIR).
	Control string
}

// bufSize holds the header and a few short status lines.
const bufSize = 16 << 10

// Read returns the state of the dm device whose node is path (symlinks
// followed); an error for anything but a dm block device.
func (r Reader) Read(path string) (State, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return State{}, fmt.Errorf("device %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return State{}, fmt.Errorf("device %s: not a block device", path)
	}
	ctl, err := os.OpenFile(r.Control, os.O_RDWR, 0)
	if err != nil {
		return State{}, fmt.Errorf("device-mapper control: %w", err)
	}
	defer ctl.Close() //nolint:errcheck // read-only use; nothing to flush
	// uint64s align the header as the kernel's struct dm_ioctl.
	words := make([]uint64, bufSize/8)
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), bufSize) //nolint:gosec // G103: the ioctl's buffer, sized above
	hdr := (*unix.DmIoctl)(unsafe.Pointer(&words[0]))                //nolint:gosec // G103: the ioctl's header at its start
	hdr.Version = [3]uint32{unix.DM_VERSION_MAJOR, 0, 0}
	hdr.Data_size = bufSize
	hdr.Data_start = unix.SizeofDmIoctl
	hdr.Dev = st.Rdev
	// A status read must not flush the device's queued I/O.
	hdr.Flags = unix.DM_NOFLUSH_FLAG
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, ctl.Fd(), unix.DM_TABLE_STATUS, uintptr(unsafe.Pointer(&words[0]))); errno != 0 { //nolint:gosec // G103: the ioctl's argument
		return State{}, fmt.Errorf("device %s: DM_TABLE_STATUS: %w", path, errno)
	}
	return parse(buf)
}

var errShort = errors.New("device-mapper reply is shorter than its header says")

func parse(buf []byte) (State, error) {
	if len(buf) < unix.SizeofDmIoctl {
		return State{}, errShort
	}
	hdr := (*unix.DmIoctl)(unsafe.Pointer(&buf[0])) //nolint:gosec // G103: the reply's header, length checked
	if hdr.Flags&unix.DM_BUFFER_FULL_FLAG != 0 {
		return State{}, fmt.Errorf("device-mapper reply did not fit %d bytes", len(buf))
	}
	if hdr.Target_count != 1 {
		return State{}, nil
	}
	start := int(hdr.Data_start)
	if start+unix.SizeofDmTargetSpec > len(buf) || start+unix.SizeofDmTargetSpec > int(hdr.Data_size) {
		return State{}, errShort
	}
	spec := (*unix.DmTargetSpec)(unsafe.Pointer(&buf[start])) //nolint:gosec // G103: the reply's first target, length checked
	target := cString(spec.Target_type[:])
	status := cString(buf[start+unix.SizeofDmTargetSpec : min(len(buf), int(hdr.Data_size))])
	if target != "snapshot" {
		return State{Status: status}, nil
	}
	bad, err := invalid(status)
	if err != nil {
		return State{}, err
	}
	return State{Snapshot: true, Invalid: bad, Status: status}, nil
}

// invalid reads a snapshot status line: "Invalid", "Overflow" or "Merge
// failed", else "<allocated>/<total> <metadata>" in sectors. A full store is
// as good as invalid: the next origin write invalidates it, and lvs reports
// 100 % as such.
func invalid(status string) (bool, error) {
	switch status {
	case "Invalid", "Overflow", "Merge failed":
		return true, nil
	}
	fields := strings.Fields(status)
	if len(fields) > 0 {
		if used, total, ok := strings.Cut(fields[0], "/"); ok {
			u, err1 := strconv.ParseUint(used, 10, 64)
			t, err2 := strconv.ParseUint(total, 10, 64)
			if err1 == nil && err2 == nil && t > 0 {
				return u >= t, nil
			}
		}
	}
	return false, fmt.Errorf("snapshot status %q: not one the kernel is known to print", status)
}

func cString(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}
