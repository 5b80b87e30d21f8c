package changemap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestParseThinDelta: the bytes named are the ranges that differ,
// were written (right_only) or discarded (left_only), in pool blocks;
// testdata holds thin_delta 0.9.0's real output (testdata/README.md).
func TestParseThinDelta(t *testing.T) {
	const block = 128 * 512
	recorded := Set{{2 * block, block}, {20 * block, block}, {30 * block, 3 * block}}
	tests := []struct {
		name    string
		xml     string
		want    Set
		wantErr string
	}{
		{"recorded", file(t, "thin_delta.xml"), recorded, ""},
		{"recorded --verbose", file(t, "thin_delta_verbose.xml"), recorded, ""},
		{"no change", `<superblock data_block_size="128"><diff left="1" right="2"><same begin="0" length="9"/></diff></superblock>`, nil, ""},
		{"nothing mapped", `<superblock data_block_size="128"><diff left="1" right="2"></diff></superblock>`, nil, ""},
		{"neighbours merge", `<superblock data_block_size="1024"><diff left="1" right="2">
			<different begin="4" length="2"/><right_only begin="6" length="1"/><left_only begin="7" length="1"/><same begin="8" length="1"/>
			<right_only begin="9" length="1"/></diff></superblock>`, Set{{4 * 1024 * 512, 4 * 1024 * 512}, {9 * 1024 * 512, 1024 * 512}}, ""},
		{"no block size", `<superblock><diff left="1" right="2"/></superblock>`, nil, "without data_block_size"},
		{"zero block size", `<superblock data_block_size="0"><diff left="1" right="2"/></superblock>`, nil, "data_block_size is 0"},
		{"no diff", `<superblock data_block_size="128"></superblock>`, nil, "0 <diff>"},
		{"range outside a diff", `<superblock data_block_size="128"><different begin="1" length="1"/></superblock>`, nil, "outside"},
		{"bad number", `<superblock data_block_size="128"><diff><different begin="x" length="1"/></diff></superblock>`, nil, "invalid syntax"},
		{"no length", `<superblock data_block_size="128"><diff><different begin="1"/></diff></superblock>`, nil, "without length"},
		{"unknown element", `<superblock data_block_size="128"><diff><moved begin="1" length="1"/></diff></superblock>`, nil, "unknown element <moved>"},
		{"out of range", `<superblock data_block_size="128"><diff left="1" right="2"><different begin="18446744073709551" length="2"/></diff></superblock>`, nil, "thin_delta's output: <different> at block 18446744073709551 of 2 is out of range"},
		{"block size out of range", `<superblock data_block_size="36028797018963968"><diff left="1" right="2"/></superblock>`, nil, "data_block_size is 36028797018963968"},
		{"not XML", `Unable to find mapping tree for snap2 (9)`, nil, "0 <diff>"},
		{"cut short", `<superblock data_block_size="128"><diff><different begin="1" length="1"/>`, nil, "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseThinDelta(strings.NewReader(tt.xml))
			checkSet(t, got, err, tt.want, tt.wantErr)
		})
	}
}

// checkSet checks a result against the set want or, when wantErr is
// set, an error saying it; it tells whether the call succeeded.
func checkSet(t *testing.T, got Set, err error, want Set, wantErr string) bool {
	t.Helper()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %v, want one saying %q", err, wantErr)
		}
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	return true
}

func file(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fakePool is a thin pool as dmsetup and thin_delta see it: its devices'
// tables, whether its metadata snapshot is reserved, and what
// thin_delta prints.
type fakePool struct {
	tables   map[string]string
	reserved bool
	// failReserve fails that many reserves even when none is held.
	failReserve int
	delta       string
	deltaErr    error
	// deltaArgs is the last thin_delta command line.
	deltaArgs []string
	// deltaReserved: the metadata snapshot was reserved when thin_delta ran.
	deltaReserved bool
	// dump is what thin_dump prints; dumpArgs and dumpReserved as for
	// thin_delta.
	dump         string
	dumpArgs     []string
	dumpReserved bool
}

func (p *fakePool) Run(_ context.Context, cmd string, args ...string) ([]byte, error) {
	switch {
	case cmd == "dmsetup" && len(args) == 2 && args[0] == "table":
		tb, ok := p.tables[args[1]]
		if !ok {
			return nil, fmt.Errorf("device %s: no such device", args[1])
		}
		return []byte(tb), nil
	case cmd == "dmsetup" && len(args) == 4 && args[0] == "message" && args[1] == "vg--a-pool-tpool" && args[2] == "0":
		switch args[3] {
		case "reserve_metadata_snap":
			if p.reserved || p.failReserve > 0 {
				p.failReserve = max(p.failReserve-1, 0)
				return nil, errors.New("device-mapper: message ioctl failed: Device or resource busy")
			}
			p.reserved = true
		case "release_metadata_snap":
			if !p.reserved {
				return nil, errors.New("device-mapper: message ioctl failed: Invalid argument")
			}
			p.reserved = false
		default:
			return nil, fmt.Errorf("unknown message %q", args[3])
		}
		return nil, nil
	case cmd == "dmsetup" && len(args) == 2 && args[0] == "status" && args[1] == "vg--a-pool-tpool":
		// As a pool of thin-provisioning-tools' kernel prints it; the
		// seventh field is the held metadata root.
		root := "-"
		if p.reserved {
			root = "2051"
		}
		return []byte("0 8388608 thin-pool 4 243/4096 512/65536 " + root + " rw discard_passdown queue_if_no_space - 1024\n"), nil
	case cmd == "thin_dump":
		p.dumpArgs, p.dumpReserved = args, p.reserved
		return []byte(p.dump), p.deltaErr
	case cmd == "thin_delta":
		p.deltaArgs, p.deltaReserved = args, p.reserved
		return []byte(p.delta), p.deltaErr
	}
	return nil, fmt.Errorf("unexpected command %s %q", cmd, args)
}

// TestThinChanges: the thin IDs come from the devices' tables, the
// metadata snapshot is reserved around thin_delta and always released;
// one held already (by another program, or left by a killed agent) is
// never released: the call fails with ErrMetadataSnapHeld.
func TestThinChanges(t *testing.T) {
	delta := `<superblock data_block_size="128"><diff left="7" right="3"><right_only begin="1" length="1"/></diff></superblock>`
	tables := map[string]string{"vg--a-vol": "0 131072 thin 253:4 3\n", "vg--a-snap": "0 131072 thin 253:4 7\n"}
	runPoolCases(t, tables, []poolCase{
		{"free pool", fakePool{delta: delta}, "", false},
		{"held by another program", fakePool{delta: delta, reserved: true}, "metadata snapshot is held already (block 2051)", true},
		{"reserve fails, none held", fakePool{delta: delta, failReserve: 1}, "(none is held)", false},
		{"thin_delta fails", fakePool{delta: "", deltaErr: errors.New("exit status 1")}, "thin_delta of thin devices 7 and 3 of vg-a/pool", false},
		{"thin_delta prints garbage", fakePool{delta: "<superblock>"}, "thin_delta's output", false},
		{"base not active", fakePool{tables: map[string]string{"vg--a-vol": tables["vg--a-vol"]}}, "no such device", false},
		{"another pool", fakePool{tables: map[string]string{"vg--a-vol": tables["vg--a-vol"], "vg--a-snap": "0 131072 thin 253:9 7\n"}}, "in pool device 253:4", false},
		{"not thin", fakePool{tables: map[string]string{"vg--a-vol": "0 131072 linear 8:16 2048\n", "vg--a-snap": tables["vg--a-snap"]}}, "not one thin target", false},
		{"external origin", fakePool{tables: map[string]string{"vg--a-vol": "0 131072 thin 253:4 3 253:1\n", "vg--a-snap": tables["vg--a-snap"]}}, "external origin", false},
	}, func(t *testing.T, f *Finder) (Set, error) {
		return f.ThinChanges(t.Context(), "vg-a", "pool", "snap", "vol")
	}, func(t *testing.T, p *fakePool) {
		if want := []string{"--metadata-snap", "--snap1", "7", "--snap2", "3", "/dev/mapper/vg--a-pool_tmeta"}; !slices.Equal(p.deltaArgs, want) || !p.deltaReserved {
			t.Errorf("thin_delta %q (reserved: %v), want %q with the metadata snapshot reserved", p.deltaArgs, p.deltaReserved, want)
		}
	})
}

// poolCase is a case of a call that reads a pool's metadata snapshot:
// what pool the Finder runs on, the error wanted, and whether the snapshot
// was held before (it then stays held).
type poolCase struct {
	name         string
	pool         fakePool
	wantErr      string
	wantReserved bool
}

// runPoolCases runs call on a Finder over each case's pool (over tables
// when it names none): a snapshot held already is ErrMetadataSnapHeld and
// stays held, one the call reserved is released, and a call that succeeds
// answers the block the pools map and ran as ran checks.
func runPoolCases(t *testing.T, tables map[string]string, cases []poolCase, call func(*testing.T, *Finder) (Set, error), ran func(*testing.T, *fakePool)) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.pool
			if p.tables == nil {
				p.tables = tables
			}
			got, err := call(t, &Finder{Run: &p, DevDir: "/dev"})
			if tt.wantReserved != errors.Is(err, ErrMetadataSnapHeld) {
				t.Errorf("%v; want ErrMetadataSnapHeld: %v", err, tt.wantReserved)
			}
			if p.reserved != tt.wantReserved {
				t.Errorf("metadata snapshot reserved after the call: %v", p.reserved)
			}
			if checkSet(t, got, err, Set{{128 * 512, 128 * 512}}, tt.wantErr) {
				ran(t, &p)
			}
		})
	}
}

// TestThinChangesNames: names that are not LVM's never reach a command.
func TestThinChangesNames(t *testing.T) {
	p := &fakePool{}
	f := &Finder{Run: p, DevDir: "/dev"}
	for _, n := range [][4]string{{"-vg", "pool", "snap", "vol"}, {"vg", "po ol", "snap", "vol"}, {"vg", "pool", "../snap", "vol"}, {"vg", "pool", "snap", ""}} {
		if _, err := f.ThinChanges(t.Context(), n[0], n[1], n[2], n[3]); err == nil || !strings.Contains(err.Error(), "not an LVM name") {
			t.Errorf("%q: %v, want a refusal of the name", n, err)
		}
	}
}

// TestParseThinDump: the bytes a device maps, single and range
// mappings, in pool blocks; testdata holds thin_dump 0.9.0's real output
// for device 2 of testdata/thin_delta_metadata.xml (testdata/README.md).
func TestParseThinDump(t *testing.T) {
	const block = 128 * 512
	tests := []struct {
		name    string
		xml     string
		dev     uint64
		want    Set
		wantErr string
	}{
		{"recorded", file(t, "thin_dump.xml"), 2, Set{{0, 4 * block}, {10 * block, block}, {30 * block, 3 * block}}, ""},
		{"recorded, asked for another device", file(t, "thin_dump.xml"), 1, nil, "device 2, want 1"},
		{"nothing mapped", `<superblock data_block_size="128"><device dev_id="4"></device></superblock>`, 4, nil, ""},
		{"no device", `<superblock data_block_size="128"></superblock>`, 4, nil, "0 <device>"},
		{"two devices", `<superblock data_block_size="128"><device dev_id="4"/><device dev_id="4"/></superblock>`, 4, nil, "2 <device>"},
		{"mapping outside a device", `<superblock data_block_size="128"><single_mapping origin_block="1" data_block="1" time="0"/></superblock>`, 4, nil, "outside"},
		{"no block size", `<superblock><device dev_id="4"/></superblock>`, 4, nil, "without data_block_size"},
		{"out of range", `<superblock data_block_size="128"><device dev_id="4"><range_mapping origin_begin="18446744073709551" data_begin="0" length="2" time="0"/></device></superblock>`, 4, nil, "thin_dump's output: <range_mapping> at block 18446744073709551 of 2 is out of range"},
		{"no length", `<superblock data_block_size="128"><device dev_id="4"><range_mapping origin_begin="1" data_begin="0" time="0"/></device></superblock>`, 4, nil, "without length"},
		{"unknown element", `<superblock data_block_size="128"><device dev_id="4"><def name="1"/></device></superblock>`, 4, nil, "unknown element <def>"},
		{"not XML", `bad checksum in superblock`, 4, nil, "0 <device>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseThinDump(strings.NewReader(tt.xml), tt.dev)
			checkSet(t, got, err, tt.want, tt.wantErr)
		})
	}
}

// TestThinMapped: thin_dump of the volume's thin ID runs on a reserved
// metadata snapshot, which is always released; one held already is
// ErrMetadataSnapHeld and stays held.
func TestThinMapped(t *testing.T) {
	dump := `<superblock data_block_size="128"><device dev_id="3"><single_mapping origin_block="1" data_block="9" time="0"/></device></superblock>`
	tables := map[string]string{"vg--a-vol": "0 131072 thin 253:4 3\n"}
	runPoolCases(t, tables, []poolCase{
		{"free pool", fakePool{dump: dump}, "", false},
		{"held by another program", fakePool{dump: dump, reserved: true}, "held already", true},
		{"thin_dump fails", fakePool{deltaErr: errors.New("exit status 1")}, "thin_dump of thin device 3 of vg-a/pool", false},
		{"thin_dump of another device", fakePool{dump: strings.Replace(dump, `"3"`, `"4"`, 1)}, "device 4, want 3", false},
		{"not active", fakePool{tables: map[string]string{}}, "no such device", false},
	}, func(t *testing.T, f *Finder) (Set, error) {
		return f.ThinMapped(t.Context(), "vg-a", "pool", "vol")
	}, func(t *testing.T, p *fakePool) {
		if want := []string{"--metadata-snap", "--dev-id", "3", "/dev/mapper/vg--a-pool_tmeta"}; !slices.Equal(p.dumpArgs, want) || !p.dumpReserved {
			t.Errorf("thin_dump %q (reserved: %v), want %q with the metadata snapshot reserved", p.dumpArgs, p.dumpReserved, want)
		}
	})
}

// TestPoolActive: a pool is active when its "-tpool" device node exists; a
// missing node, a regular file in its place, or a name that is not LVM's
// is not.
func TestPoolActive(t *testing.T) {
	dev := t.TempDir()
	if err := os.Mkdir(filepath.Join(dev, "mapper"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A device node needs root (make test runs the unit tier as root);
	// without it only the negative cases are checked.
	node := unix.Mknod(filepath.Join(dev, "mapper", "vg--a-pool0-tpool"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 250))) == nil
	if err := os.WriteFile(filepath.Join(dev, "mapper", "vg--a-pool1-tpool"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f := &Finder{DevDir: dev}
	for pool, want := range map[string]bool{"pool0": node, "pool1": false, "pool2": false, "../pool0": false} {
		if got := f.PoolActive("vg-a", pool); got != want {
			t.Errorf("PoolActive(vg-a, %s) = %v, want %v", pool, got, want)
		}
	}
}
