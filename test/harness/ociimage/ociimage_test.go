package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// hostFile writes content to a temporary file and returns its path.
func hostFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWriteRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		img   Image
		files map[string]string // path in the image -> content
		modes map[string]os.FileMode
		arch  string
	}{
		{
			name:  "one program at the root",
			img:   Image{Name: "registry.k8s.io/pause:3.10", Entrypoint: []string{"/pause"}},
			files: map[string]string{"/pause": "PAUSE"},
			modes: map[string]os.FileMode{"/pause": 0o755},
			arch:  "amd64",
		},
		{
			name:  "nested files, another architecture",
			img:   Image{Name: "localhost:5000/a/b:v1", Entrypoint: []string{"/usr/local/bin/x", "-v"}, Architecture: "arm64"},
			files: map[string]string{"/usr/local/bin/x": "X", "/etc/x.conf": "conf"},
			modes: map[string]os.FileMode{"/usr/local/bin/x": 0o755, "/etc/x.conf": 0o644},
			arch:  "arm64",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for p, content := range tc.files {
				tc.img.Files = append(tc.img.Files, File{Path: p, Mode: tc.modes[p], Source: hostFile(t, content)})
			}
			archive := filepath.Join(t.TempDir(), "img.tar")
			if err := WriteFile(archive, tc.img); err != nil {
				t.Fatal(err)
			}
			l, err := Extract(archive, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(l.Names, []string{tc.img.Name}) {
				t.Errorf("names %v, want [%s]", l.Names, tc.img.Name)
			}
			ann := l.Index.Manifests[0].Annotations
			if ann[AnnotationImageName] != tc.img.Name || ann[v1.AnnotationRefName] != tc.img.Name {
				t.Errorf("index annotations %v, want both names %s", ann, tc.img.Name)
			}
			if p := l.Index.Manifests[0].Platform; p == nil || p.Architecture != tc.arch || p.OS != "linux" {
				t.Errorf("index platform %+v, want linux/%s", p, tc.arch)
			}
			if !reflect.DeepEqual(l.Config.Config.Entrypoint, tc.img.Entrypoint) || l.Config.Architecture != tc.arch || l.Config.OS != "linux" {
				t.Errorf("config %+v, want entrypoint %v on linux/%s", l.Config, tc.img.Entrypoint, tc.arch)
			}
			if len(l.Manifest.Layers) != 1 || l.Manifest.Layers[0].MediaType != v1.MediaTypeImageLayer {
				t.Errorf("layers %+v, want one uncompressed layer", l.Manifest.Layers)
			}
			root := t.TempDir()
			if err := l.Unpack(root); err != nil {
				t.Fatal(err)
			}
			for p, content := range tc.files {
				got, err := os.ReadFile(filepath.Join(root, p))
				if err != nil {
					t.Fatal(err)
				}
				fi, err := os.Stat(filepath.Join(root, p))
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != content || fi.Mode().Perm() != tc.modes[p] {
					t.Errorf("%s: %q mode %v, want %q mode %v", p, got, fi.Mode().Perm(), content, tc.modes[p])
				}
			}
		})
	}
}

// TestWriteIsReproducible: the same inputs give the same archive, so its
// digest can key a cache.
func TestWriteIsReproducible(t *testing.T) {
	img := Image{Name: "registry.k8s.io/pause:3.10", Entrypoint: []string{"/pause"},
		Files: []File{{Path: "/pause", Mode: 0o755, Source: hostFile(t, "PAUSE")}}}
	var a, b bytes.Buffer
	if err := Write(&a, img); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, img); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two writes of the same image differ")
	}
}

func TestWriteRejects(t *testing.T) {
	src := hostFile(t, "x")
	for _, tc := range []struct {
		name, want string
		img        Image
	}{
		{"no registry", "not a full reference", Image{Name: "pause:3.10", Entrypoint: []string{"/p"}}},
		{"no tag", "not a full reference", Image{Name: "registry.k8s.io/pause", Entrypoint: []string{"/p"}}},
		{"digest", "not a full reference", Image{Name: "registry.k8s.io/pause@sha256:00", Entrypoint: []string{"/p"}}},
		{"no entrypoint", "no entrypoint", Image{Name: "registry.k8s.io/pause:3.10"}},
		{"relative path", "not a clean absolute path", Image{Name: "registry.k8s.io/pause:3.10", Entrypoint: []string{"/p"}, Files: []File{{Path: "p", Source: src}}}},
		{"dirty path", "not a clean absolute path", Image{Name: "registry.k8s.io/pause:3.10", Entrypoint: []string{"/p"}, Files: []File{{Path: "/a/../p", Source: src}}}},
		{"missing source", "no such file", Image{Name: "registry.k8s.io/pause:3.10", Entrypoint: []string{"/p"}, Files: []File{{Path: "/p", Source: "/nonexistent/p"}}}},
		{"source is a directory", "not a regular file", Image{Name: "registry.k8s.io/pause:3.10", Entrypoint: []string{"/p"}, Files: []File{{Path: "/p", Source: t.TempDir()}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "img.tar")
			err := WriteFile(dst, tc.img)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
			if entries, _ := os.ReadDir(filepath.Dir(dst)); len(entries) != 0 {
				t.Errorf("a failed write left %v behind", entries)
			}
		})
	}
}

// TestWriteLayoutFile names an existing layout (as buildah writes one:
// gzip layers, only the OCI ref name set), inflating its layers on request.
func TestWriteLayoutFile(t *testing.T) {
	layer := layerBlob(t, []tarEntry{{name: "x", typ: tar.TypeReg, content: "X"}})
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(layer.data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	gzLayer := bytesBlob(v1.MediaTypeImageLayerGzip, gz.Bytes())
	const name = "ghcr.io/carve-csi/carve:v0.1.0"
	for _, tc := range []struct {
		name         string
		uncompressed bool
		wantLayer    v1.Descriptor
		sameManifest bool
	}{
		{"kept as it is", false, gzLayer.desc, true},
		{"inflated", true, layer.desc, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := layoutOf(t, []digest.Digest{layer.desc.Digest}, gzLayer)
			orig.Index.Manifests[0].Annotations = map[string]string{v1.AnnotationRefName: "built"}
			data, err := json.Marshal(orig.Index)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(orig.Dir, v1.ImageIndexFile), data, 0o644); err != nil {
				t.Fatal(err)
			}
			archive := filepath.Join(t.TempDir(), "named.tar")
			if err := WriteLayoutFile(archive, orig.Dir, name, tc.uncompressed); err != nil {
				t.Fatal(err)
			}
			if entries, _ := os.ReadDir(filepath.Dir(archive)); len(entries) != 1 {
				t.Errorf("left behind beside the archive: %v", entries)
			}
			l, err := Extract(archive, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(l.Names, []string{name}) {
				t.Errorf("names %v, want [%s]", l.Names, name)
			}
			if got := l.Index.Manifests[0].Digest == orig.Index.Manifests[0].Digest; got != tc.sameManifest {
				t.Errorf("manifest %s, the layout's %s; same: %v, want %v", l.Index.Manifests[0].Digest, orig.Index.Manifests[0].Digest, got, tc.sameManifest)
			}
			if !reflect.DeepEqual(l.Manifest.Layers, []v1.Descriptor{tc.wantLayer}) {
				t.Errorf("layers %+v, want %+v", l.Manifest.Layers, tc.wantLayer)
			}
			root := t.TempDir()
			if err := l.Unpack(root); err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(root, "x")); err != nil || string(got) != "X" {
				t.Errorf("x: %q, %v", got, err)
			}
		})
	}
}

// tarEntry is one entry of a hand-made layer.
type tarEntry struct {
	name, content, link string
	typ                 byte
}

func layerBlob(t *testing.T, entries []tarEntry) blob {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o755, Linkname: e.link, Size: int64(len(e.content))}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.content)); err != nil && e.typ == tar.TypeReg {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytesBlob(v1.MediaTypeImageLayer, buf.Bytes())
}

// layoutOf writes a layout of the given layers into a directory; diffIDs
// nil means the layers are uncompressed.
func layoutOf(t *testing.T, diffIDs []digest.Digest, layers ...blob) *Layout {
	t.Helper()
	cfg := v1.Image{Platform: v1.Platform{Architecture: "amd64", OS: "linux"}, RootFS: v1.RootFS{Type: "layers", DiffIDs: diffIDs}}
	man := v1.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: v1.MediaTypeImageManifest}
	for _, l := range layers {
		if diffIDs == nil {
			cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.desc.Digest)
		}
		man.Layers = append(man.Layers, l.desc)
	}
	cfgJSON, _ := json.Marshal(cfg)
	config := bytesBlob(v1.MediaTypeImageConfig, cfgJSON)
	man.Config = config.desc
	manJSON, _ := json.Marshal(man)
	manifest := bytesBlob(v1.MediaTypeImageManifest, manJSON)
	var archive bytes.Buffer
	if err := writeLayout(&archive, "example.com/layers:1", manifest.desc, append(layers, config, manifest)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "layers.tar")
	if err := os.WriteFile(p, archive.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Extract(p, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestUnpackLayers: later layers replace, whiteouts remove, opaque
// directories hide what lower layers put there, and links resolve inside
// the root.
func TestUnpackLayers(t *testing.T) {
	lower := layerBlob(t, []tarEntry{
		{name: "usr/", typ: tar.TypeDir},
		{name: "usr/bin/", typ: tar.TypeDir},
		{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		{name: "usr/bin/sh", typ: tar.TypeReg, content: "old sh"},
		{name: "usr/bin/gone", typ: tar.TypeReg, content: "x"},
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/opq/", typ: tar.TypeDir},
		{name: "etc/opq/old", typ: tar.TypeReg, content: "x"},
		{name: "etc/file-then-dir", typ: tar.TypeReg, content: "x"},
	})
	upper := layerBlob(t, []tarEntry{
		{name: "usr/bin/sh", typ: tar.TypeReg, content: "new sh"},
		{name: "usr/bin/.wh.gone", typ: tar.TypeReg},
		{name: "etc/opq/new", typ: tar.TypeReg, content: "kept"},
		{name: "etc/opq/.wh..wh..opq", typ: tar.TypeReg},
		{name: "etc/file-then-dir/", typ: tar.TypeDir},
		{name: "etc/sh-link", typ: tar.TypeLink, link: "bin/sh"},
		{name: "etc/abs", typ: tar.TypeSymlink, link: "/usr/bin/sh"},
	})
	root := t.TempDir()
	if err := layoutOf(t, nil, lower, upper).Unpack(root); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, content string
		missing, dir  bool
	}{
		{path: "/bin/sh", content: "new sh"},
		{path: "/usr/bin/gone", missing: true},
		{path: "/etc/opq/old", missing: true},
		{path: "/etc/opq/new", content: "kept"},
		{path: "/etc/file-then-dir", dir: true},
		{path: "/etc/sh-link", content: "new sh"},
		{path: "/etc/abs", content: "new sh"},
	} {
		p, err := ResolveInRoot(root, tc.path)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		switch {
		case tc.missing:
			if err == nil {
				t.Errorf("%s exists, want it removed", tc.path)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.path, err)
		case tc.dir:
			if !fi.IsDir() {
				t.Errorf("%s is not a directory", tc.path)
			}
		default:
			got, err := os.ReadFile(p)
			if err != nil || string(got) != tc.content {
				t.Errorf("%s: %q, %v; want %q", tc.path, got, err, tc.content)
			}
		}
	}
}

// TestUnpackChecksDigests: a layer whose diff ID is wrong is refused.
func TestUnpackChecksDigests(t *testing.T) {
	l := layoutOf(t, nil, layerBlob(t, []tarEntry{{name: "a", typ: tar.TypeReg, content: "a"}}))
	l.Config.RootFS.DiffIDs[0] = digest.FromString("something else")
	if err := l.Unpack(t.TempDir()); err == nil || !strings.Contains(err.Error(), "diff ID") {
		t.Errorf("got %v, want a diff ID mismatch", err)
	}
}

func TestResolveInRoot(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"usr/sbin", "etc/alternatives"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"sbin":                   "usr/sbin",
		"etc/alternatives/x":     "/usr/sbin/x.real",
		"usr/sbin/up":            "../../../../etc",
		"usr/sbin/loop":          "loop",
		"usr/sbin/relative-link": "../sbin/x.real",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ in, want, err string }{
		{in: "/sbin/lvm", want: "usr/sbin/lvm"},
		{in: "/etc/alternatives/x", want: "usr/sbin/x.real"},
		{in: "/usr/sbin/up/passwd", want: "etc/passwd"},
		{in: "/../../etc", want: "etc"},
		{in: "/sbin/relative-link", want: "usr/sbin/x.real"},
		{in: "/usr/sbin/loop", err: "too many symlinks"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ResolveInRoot(root, tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("got %q, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != filepath.Join(root, tc.want) {
				t.Errorf("got %q, %v; want %q", got, err, filepath.Join(root, tc.want))
			}
		})
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	for _, name := range []string{"../evil", "/abs", "blobs/../../evil"} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}); err != nil {
				t.Fatal(err)
			}
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "evil.tar")
			if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := Extract(p, t.TempDir()); err == nil || !strings.Contains(err.Error(), "leaves the layout") {
				t.Errorf("got %v, want a refusal", err)
			}
		})
	}
}
