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

// TestOpenStateAdoptsTheSocketDirectory: marks an earlier carve kept in
// the --endpoint socket's directory (its default state directory) move
// into --state-dir at start, and are found there.
func TestOpenStateAdoptsTheSocketDirectory(t *testing.T) {
	sockDir, stateDir := t.TempDir(), filepath.Join(t.TempDir(), "carve")
	for _, kind := range stateKinds {
		old, err := marks.Open(filepath.Join(sockDir, kind))
		if err != nil {
			t.Fatal(err)
		}
		if err := old.Mark("vg1", "carve-"+kind); err != nil {
			t.Fatal(err)
		}
	}
	o := &NodeOptions{StateDir: stateDir, AllowVolatileStateDir: true}
	o.Endpoint = "unix://" + filepath.Join(sockDir, "csi.sock")
	for _, round := range []string{"upgrade", "restart"} {
		unfinished, formatting, err := openState(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		for kind, m := range map[string]*marks.Marks{"unfinished": unfinished, "formatting": formatting} {
			if m.Dir() != filepath.Join(stateDir, kind) {
				t.Errorf("%s: %s marks in %s, want %s", round, kind, m.Dir(), filepath.Join(stateDir, kind))
			}
			if ok, err := m.Has("vg1", "carve-"+kind); err != nil || !ok {
				t.Errorf("%s: the %s mark left in the socket's directory is not found (%v)", round, kind, err)
			}
			if _, err := os.Stat(filepath.Join(sockDir, kind, "vg1", "carve-"+kind)); !os.IsNotExist(err) {
				t.Errorf("%s: the %s mark is still in the socket's directory (%v)", round, kind, err)
			}
		}
	}
	// Without --state-dir the socket's directory is the state directory.
	o.StateDir = ""
	unfinished, _, err := openState(context.Background(), o)
	if err != nil || unfinished.Dir() != filepath.Join(sockDir, "unfinished") {
		t.Errorf("without --state-dir: %v, %v; want the socket's directory", unfinished, err)
	}
}
