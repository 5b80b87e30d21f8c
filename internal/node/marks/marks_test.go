package marks

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMarks(t *testing.T) {
	m, err := Open(filepath.Join(t.TempDir(), "state", "unfinished"))
	if err != nil {
		t.Fatal(err)
	}
	has := func(vg, lv string) bool {
		t.Helper()
		ok, err := m.Has(vg, lv)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	steps := []struct {
		name string
		do   func() error
		want map[[2]string]bool
	}{
		{"nothing marked", func() error { return nil }, map[[2]string]bool{{"vg1", "a"}: false}},
		{"mark", func() error { return m.Mark("vg1", "a") }, map[[2]string]bool{{"vg1", "a"}: true, {"vg1", "b"}: false, {"vg2", "a"}: false}},
		{"mark again", func() error { return m.Mark("vg1", "a") }, map[[2]string]bool{{"vg1", "a"}: true}},
		{"another VG", func() error { return m.Mark("vg.2", "a") }, map[[2]string]bool{{"vg1", "a"}: true, {"vg.2", "a"}: true}},
		{"clear", func() error { return m.Clear("vg1", "a") }, map[[2]string]bool{{"vg1", "a"}: false, {"vg.2", "a"}: true}},
		{"clear again", func() error { return m.Clear("vg1", "a") }, map[[2]string]bool{{"vg1", "a"}: false}},
		{"clear an unknown VG", func() error { return m.Clear("vg9", "a") }, map[[2]string]bool{{"vg9", "a"}: false}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		for k, want := range s.want {
			if got := has(k[0], k[1]); got != want {
				t.Errorf("after %s: %s/%s marked %v, want %v", s.name, k[0], k[1], got, want)
			}
		}
	}
	// The marks outlive the process: a new Open sees them.
	again, err := Open(m.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := again.Has("vg.2", "a"); err != nil || !ok {
		t.Errorf("reopened: vg.2/a marked %v (%v), want true", ok, err)
	}
}

func TestMarksRefuseWhatIsNoLVMName(t *testing.T) {
	m, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range [][2]string{{"", "a"}, {"vg", ""}, {"..", "a"}, {"vg", ".."}, {".", "a"}, {"vg/x", "a"}, {"vg", "a/../../b"}} {
		if err := m.Mark(n[0], n[1]); err == nil {
			t.Errorf("Mark(%q, %q) succeeded", n[0], n[1])
		}
		if err := m.Clear(n[0], n[1]); err == nil {
			t.Errorf("Clear(%q, %q) succeeded", n[0], n[1])
		}
		if _, err := m.Has(n[0], n[1]); err == nil {
			t.Errorf("Has(%q, %q) succeeded", n[0], n[1])
		}
	}
	entries, err := os.ReadDir(m.Dir())
	if err != nil || len(entries) != 0 {
		t.Errorf("the directory holds %v (%v) after refused names", entries, err)
	}
}

func TestOpenRefusesARelativeDirectory(t *testing.T) {
	if _, err := Open("state/unfinished"); err == nil {
		t.Error("Open of a relative directory succeeded")
	}
}

// BenchmarkMarkClear is the cost carve adds to a thick CreateVolume; run
// it with TMPDIR on the disk the plugin directory is on.
func BenchmarkMarkClear(b *testing.B) {
	m, err := Open(filepath.Join(b.TempDir(), "unfinished"))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := m.Mark("vg", "lv"); err != nil {
			b.Fatal(err)
		}
		if err := m.Clear("vg", "lv"); err != nil {
			b.Fatal(err)
		}
	}
}

// A mark made once the LV exists names it (its UUID); one made before, or
// torn by a crash before its sync, names nobody.
func TestMarkOwner(t *testing.T) {
	const uuid = "IjYeuk-LGsf-T6VI-F93h-13Fd-JSqi-dA6eI4"
	m, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		make   func(p string) error
		owner  string
		marked bool
	}{
		{name: "no mark", make: func(string) error { return nil }},
		{name: "Mark", make: func(string) error { return m.Mark("vg", "lv") }, marked: true},
		{name: "MarkOf", make: func(string) error { return m.MarkOf("vg", "lv", uuid) }, owner: uuid, marked: true},
		{name: "Mark keeps the owner", make: func(string) error {
			if err := m.MarkOf("vg", "lv", uuid); err != nil {
				return err
			}
			return m.Mark("vg", "lv")
		}, owner: uuid, marked: true},
		{name: "torn", make: func(p string) error {
			if err := m.Mark("vg", "lv"); err != nil {
				return err
			}
			return os.WriteFile(p, []byte(uuid[:9]), 0o600)
		}, marked: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := m.Clear("vg", "lv"); err != nil {
				t.Fatal(err)
			}
			if err := tc.make(filepath.Join(m.Dir(), "vg", "lv")); err != nil {
				t.Fatal(err)
			}
			owner, marked, err := m.Owner("vg", "lv")
			if err != nil || owner != tc.owner || marked != tc.marked {
				t.Errorf("Owner = %q, %v, %v; want %q, %v", owner, marked, err, tc.owner, tc.marked)
			}
		})
	}
	if err := m.MarkOf("vg", "lv2", "not-a-uuid\n"); err == nil {
		t.Error("MarkOf with an owner that is no LVM UUID succeeded")
	}
}

func TestVolatile(t *testing.T) {
	got, err := Volatile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the test's temporary directory is on %q", got)
	if got, err := Volatile("/dev/shm"); err == nil && got != "tmpfs" {
		t.Errorf("Volatile(/dev/shm) = %q, want tmpfs", got)
	}
	if _, err := Volatile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Volatile of a missing directory succeeded")
	}
}
