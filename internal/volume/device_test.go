package volume

import (
	"os"
	"path/filepath"
	"testing"
)

// TestDevDir: DM_DEV_DIR as lvm.New reads it (internal/node/lvm/run_test.go checks
// lvm's side of the same rule).
func TestDevDir(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, "/dev"},
		{[]string{"PATH=/bin", "DM_DEV_DIR=/alt/dev"}, "/alt/dev"},
		{[]string{"DM_DEV_DIR=/a", "DM_DEV_DIR=/b"}, "/b"},
		{[]string{"DM_DEV_DIR=/a", "DM_DEV_DIR="}, "/a"},
		{[]string{"XDM_DEV_DIR=/x"}, "/dev"},
	} {
		if got := DevDir(tc.env); got != tc.want {
			t.Errorf("DevDir(%q) = %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestDevice(t *testing.T) {
	lv := LVNameFor("a")
	id := ID{VG: "vg0", LV: lv}
	for _, tc := range []struct {
		name string
		got  string
		want string
	}{
		{"under /dev", Device("/dev", id), "/dev/vg0/" + lv},
		{"under DM_DEV_DIR", Device("/alt/dev/", id), "/alt/dev/vg0/" + lv},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

func TestIsBlockDevice(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{file: false, t.TempDir(): false, "/dev/null": false, "/missing": false} {
		if got := IsBlockDevice(p); got != want {
			t.Errorf("IsBlockDevice(%s) = %t, want %t", p, got, want)
		}
	}
}
