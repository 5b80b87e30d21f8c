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
