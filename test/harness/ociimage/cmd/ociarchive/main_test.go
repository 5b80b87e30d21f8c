package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/carve-csi/carve/test/harness/ociimage"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "csi-provisioner")
	if err := os.WriteFile(bin, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.tar")
	// A layout to name, as buildah would leave one.
	layout := t.TempDir()
	built := filepath.Join(t.TempDir(), "built.tar")
	if err := ociimage.WriteFile(built, ociimage.Image{Name: "localhost/built:latest", Entrypoint: []string{"/usr/local/bin/carve"},
		Files: []ociimage.File{{Path: "/usr/local/bin/carve", Mode: 0o755, Source: bin}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ociimage.Extract(built, layout); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		args       []string
		code       int
		stderr     string
		entrypoint []string
	}{
		{name: "no subcommand", code: 2, stderr: "usage"},
		{name: "unknown subcommand", args: []string{"push"}, code: 2, stderr: "usage"},
		{name: "no name", args: []string{"files", "-o", out, bin + ":/x"}, code: 2, stderr: "usage"},
		{name: "no files", args: []string{"files", "-name", "example.com/x:1", "-o", out}, code: 2, stderr: "usage"},
		{name: "not a pair", args: []string{"files", "-name", "example.com/x:1", "-o", out, bin}, code: 2, stderr: "not HOSTPATH:IMAGEPATH"},
		{name: "bad name", args: []string{"files", "-name", "x", "-o", out, bin + ":/x"}, code: 1, stderr: "not a full reference"},
		{name: "layout needs one dir", args: []string{"layout", "-name", "example.com/x:1", "-o", out, dir, dir}, code: 2, stderr: "usage"},
		{name: "layout without index", args: []string{"layout", "-name", "example.com/x:1", "-o", out, dir}, code: 1, stderr: "index.json"},
		{name: "layout", args: []string{"layout", "-name", "ghcr.io/carve-csi/carve:v0.1.0", "-o", out, "-uncompressed", layout},
			entrypoint: []string{"/usr/local/bin/carve"}},
		{name: "help", args: []string{"files", "-h"}, code: 0, stderr: "-entrypoint"},
		{name: "default entrypoint", args: []string{"files", "-name", "registry.k8s.io/sig-storage/csi-provisioner:v6.3.0", "-o", out, bin + ":/csi-provisioner"},
			entrypoint: []string{"/csi-provisioner"}},
		{name: "entrypoint flag", args: []string{"files", "-name", "registry.k8s.io/sig-storage/csi-provisioner:v6.3.0", "-o", out, "-entrypoint", "/bin/p", bin + ":/bin/p", bin + ":/bin/q"},
			entrypoint: []string{"/bin/p"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(tc.args, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.stderr) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tc.code, tc.stderr)
			}
			if tc.entrypoint == nil {
				return
			}
			l, err := ociimage.Extract(out, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(l.Config.Config.Entrypoint, tc.entrypoint) || l.Names[0] != tc.args[2] {
				t.Errorf("entrypoint %v, names %v; want %v, %s", l.Config.Config.Entrypoint, l.Names, tc.entrypoint, tc.args[2])
			}
		})
	}
}
