package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/marks"
)

// TestOpenStateRefusesVolatile: a state directory on tmpfs (or ramfs) is
// refused, naming the filesystem and the flag that allows it; with the
// flag the plugin starts. A directory still to be made is judged by the
// one it will be made in.
func TestOpenStateRefusesVolatile(t *testing.T) {
	if fs, err := marks.Volatile("/dev/shm"); err != nil || fs != "tmpfs" {
		t.Skipf("no tmpfs at /dev/shm here (%q, %v)", fs, err)
	}
	shm, err := os.MkdirTemp("/dev/shm", "carve-state-")
	if err != nil {
		t.Skipf("cannot write to /dev/shm: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(shm) })
	sock := "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	for _, dir := range []string{shm, filepath.Join(shm, "not", "yet")} {
		o := &NodeOptions{StateDir: dir}
		o.Endpoint = sock
		_, _, err := openState(context.Background(), o)
		if err == nil {
			t.Fatalf("openState(%s) succeeded on tmpfs", dir)
		}
		for _, want := range []string{"--state-dir " + dir, "tmpfs", "--allow-volatile-state-dir"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the error does not say %q: %v", want, err)
			}
		}
		o.AllowVolatileStateDir = true
		if _, _, err := openState(context.Background(), o); err != nil {
			t.Errorf("openState(%s) with --allow-volatile-state-dir: %v", dir, err)
		}
	}
}
