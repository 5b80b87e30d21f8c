package fs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMakeMountPoint(t *testing.T) {
	tests := []struct {
		name    string
		block   bool
		wantDir bool
	}{
		{name: "filesystem volume: a directory", block: false, wantDir: true},
		{name: "raw block volume: a file", block: true, wantDir: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := filepath.Join(t.TempDir(), "pods", "target")
			for range 2 { // the second call finds it made
				if err := MakeMountPoint(target, tt.block); err != nil {
					t.Fatal(err)
				}
			}
			isDir, err := IsDirectory(target)
			if err != nil || isDir != tt.wantDir {
				t.Errorf("IsDirectory = %v, %v; want %v", isDir, err, tt.wantDir)
			}
		})
	}
}

func TestSamePath(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real")
	if err := os.Mkdir(target, 0o750); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		mounted, ours string
		want          bool
	}{
		{target, target, true},
		{target, link, true},
		{target, target + "/", true},
		{filepath.Join(dir, "other"), link, false},
	}
	for _, tt := range tests {
		if got := SamePath(tt.mounted, tt.ours); got != tt.want {
			t.Errorf("SamePath(%q, %q) = %v, want %v", tt.mounted, tt.ours, got, tt.want)
		}
	}
}
