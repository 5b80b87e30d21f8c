package dmsnapshot

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// reply builds a DM_TABLE_STATUS reply as the kernel lays it out: the
// header, then per target a struct dm_target_spec and its status line.
func reply(flags uint32, targets ...[2]string) []byte {
	buf := make([]byte, bufSize)
	le := binary.LittleEndian
	off := unix.SizeofDmIoctl
	for i, tg := range targets {
		spec := buf[off:]
		copy(spec[24:40], tg[0]) // target_type
		copy(spec[unix.SizeofDmTargetSpec:], tg[1]+"\x00")
		next := off + unix.SizeofDmTargetSpec + len(tg[1]) + 1
		next = (next + 7) &^ 7
		le.PutUint32(spec[20:24], uint32(next-unix.SizeofDmIoctl)) // next, from data_start
		if i == len(targets)-1 {
			le.PutUint32(spec[20:24], 0)
		}
		off = next
	}
	le.PutUint32(buf[12:16], bufSize)              // data_size
	le.PutUint32(buf[16:20], unix.SizeofDmIoctl)   // data_start
	le.PutUint32(buf[20:24], uint32(len(targets))) // target_count
	le.PutUint32(buf[28:32], flags)                // flags
	return buf
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		buf     []byte
		want    State
		wantErr string
	}{
		{"usable snapshot", reply(0, [2]string{"snapshot", "32/131072 16"}), State{Snapshot: true, Status: "32/131072 16"}, ""},
		{"full store", reply(0, [2]string{"snapshot", "131072/131072 16"}), State{Snapshot: true, Invalid: true, Status: "131072/131072 16"}, ""},
		{"invalidated", reply(0, [2]string{"snapshot", "Invalid"}), State{Snapshot: true, Invalid: true, Status: "Invalid"}, ""},
		{"overflowed", reply(0, [2]string{"snapshot", "Overflow"}), State{Snapshot: true, Invalid: true, Status: "Overflow"}, ""},
		{"merge failed", reply(0, [2]string{"snapshot", "Merge failed"}), State{Snapshot: true, Invalid: true, Status: "Merge failed"}, ""},
		{"linear", reply(0, [2]string{"linear", ""}), State{}, ""},
		{"thin", reply(0, [2]string{"thin", "2048 4095"}), State{Status: "2048 4095"}, ""},
		{"two targets", reply(0, [2]string{"linear", ""}, [2]string{"linear", ""}), State{}, ""},
		{"status not known", reply(0, [2]string{"snapshot", "Unknown"}), State{}, "not one the kernel"},
		{"buffer full", reply(unix.DM_BUFFER_FULL_FLAG, [2]string{"snapshot", "1/2 3"}), State{}, "did not fit"},
		{"short", make([]byte, 10), State{}, "shorter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parse(tt.buf)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parse: %v, %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("parse = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// TestReadRefuses: what is not a block device, or a control node that
// is not there, is an error, not a state.
func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := Reader{Control: filepath.Join(dir, "control")}
	if _, err := r.Read(file); err == nil || !strings.Contains(err.Error(), "not a block device") {
		t.Errorf("Read of a file: %v", err)
	}
	if _, err := r.Read(filepath.Join(dir, "gone")); err == nil {
		t.Error("Read of a missing path: no error")
	}
}
