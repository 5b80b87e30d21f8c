// Package ociimage writes and reads container images as OCI image layouts
// packed into one tar, the form `ctr images import` takes, with no container
// engine and no registry. The test beds use it for the images that are not
// built from carve's Dockerfile (the CSI sidecars and the pause image, each
// one static binary) and to name the archive buildah writes for carve's own
// image; the tests use it to look inside those archives.
//
// containerd 1.6's `ctr images import` names an image by the index entry's
// `io.containerd.image.name` annotation; it drops a full
// `org.opencontainers.image.ref.name` unless --base-name matches it. Every
// archive written here carries both, set to the full name.
package ociimage

import (
	"archive/tar"
	"bytes"
	// go-digest computes and checks sha256 digests only when it is linked.
	_ "crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// AnnotationImageName is the annotation containerd's importer names an
// image by.
const AnnotationImageName = "io.containerd.image.name"

// epoch is the time stamp of every file written, so the same inputs give the
// same bytes (and digests).
var epoch = time.Unix(0, 0).UTC()

// File is one regular file of an image's single layer.
type File struct {
	// Path is the absolute path in the image, e.g. "/csi-provisioner".
	Path string
	// Mode holds the permission bits (0o755 for a program).
	Mode os.FileMode
	// Source is the host file whose content the image gets.
	Source string
}

// Image describes a one-layer image.
type Image struct {
	// Name is the full reference the archive is imported under, e.g.
	// "registry.k8s.io/pause:3.10".
	Name string
	// Entrypoint is the config's entrypoint.
	Entrypoint []string
	// Env is the config's environment; nil means just a PATH.
	Env []string
	// Architecture is the GOARCH the files are built for; "" means amd64.
	Architecture string
	// Files make up the layer; their parent directories are added.
	Files []File
}

// blob is one content-addressed file of a layout.
type blob struct {
	desc v1.Descriptor
	// data holds small blobs; open the large ones from their file.
	data []byte
	file string
}

func bytesBlob(mediaType string, data []byte) blob {
	return blob{desc: v1.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}, data: data}
}

func (b blob) open() (io.ReadCloser, error) {
	if b.file != "" {
		return os.Open(b.file)
	}
	return io.NopCloser(bytes.NewReader(b.data)), nil
}

// WriteFile writes img as an archive at dst. It writes a temporary file in
// dst's directory and renames it, so dst is either absent or complete.
func WriteFile(dst string, img Image) error {
	return writeAtomically(dst, func(w io.Writer) error { return Write(w, img) })
}

// Write writes img to w as an OCI image layout in a tar: an uncompressed
// layer (a guest under TCG unpacks it faster than a gzip one), the config,
// the manifest and index.json naming it.
func Write(w io.Writer, img Image) error {
	if err := checkName(img.Name); err != nil {
		return err
	}
	if len(img.Entrypoint) == 0 {
		return fmt.Errorf("image %s: no entrypoint", img.Name)
	}
	var layerTar bytes.Buffer
	if err := writeLayer(&layerTar, img.Files); err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	layer := bytesBlob(v1.MediaTypeImageLayer, layerTar.Bytes())

	arch := img.Architecture
	if arch == "" {
		arch = "amd64"
	}
	env := img.Env
	if env == nil {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	created := epoch
	cfg := v1.Image{
		Created:  &created,
		Platform: v1.Platform{Architecture: arch, OS: "linux"},
		Config:   v1.ImageConfig{Entrypoint: img.Entrypoint, Env: env},
		// An uncompressed layer's diff ID is its digest.
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []digest.Digest{layer.desc.Digest}},
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("image %s: config: %w", img.Name, err)
	}
	config := bytesBlob(v1.MediaTypeImageConfig, cfgJSON)

	man := v1.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageManifest,
		Config:    config.desc,
		Layers:    []v1.Descriptor{layer.desc},
	}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return fmt.Errorf("image %s: manifest: %w", img.Name, err)
	}
	manifest := bytesBlob(v1.MediaTypeImageManifest, manJSON)
	manifest.desc.Platform = &v1.Platform{Architecture: arch, OS: "linux"}
	return writeLayout(w, img.Name, manifest.desc, []blob{layer, config, manifest})
}

// WriteLayoutFile packs the image of the OCI image layout directory dir (as
// `buildah push IMAGE oci:DIR` writes it, holding one image) into an
// archive at dst named name, atomically as WriteFile. With uncompressed,
// gzip layers are stored inflated: a guest under TCG imports them faster,
// at about twice the size; the config, whose diff IDs name the inflated
// layers, stays as it is.
func WriteLayoutFile(dst, dir, name string, uncompressed bool) error {
	if err := checkName(name); err != nil {
		return err
	}
	l, err := ReadLayout(dir)
	if err != nil {
		return fmt.Errorf("reading layout %s: %w", dir, err)
	}
	blobOf := func(desc v1.Descriptor) (blob, error) {
		p, err := l.blobPath(desc.Digest)
		return blob{desc: desc, file: p}, err
	}
	config, err := blobOf(l.Manifest.Config)
	if err != nil {
		return err
	}
	blobs := []blob{config}
	manifest, err := blobOf(l.Index.Manifests[0])
	if err != nil {
		return err
	}
	man := l.Manifest
	man.Layers = slices.Clone(man.Layers)
	changed := false
	for i, desc := range man.Layers {
		if uncompressed && desc.MediaType != v1.MediaTypeImageLayer {
			tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".layer.*")
			if err != nil {
				return err
			}
			defer func() { _ = os.Remove(tmp.Name()) }()
			err = l.inflate(desc, l.Config.RootFS.DiffIDs[i], tmp)
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("layer %d (%s): %w", i, desc.Digest, err)
			}
			info, err := os.Stat(tmp.Name())
			if err != nil {
				return err
			}
			desc = v1.Descriptor{MediaType: v1.MediaTypeImageLayer, Digest: l.Config.RootFS.DiffIDs[i], Size: info.Size()}
			man.Layers[i] = desc
			blobs = append(blobs, blob{desc: desc, file: tmp.Name()})
			changed = true
			continue
		}
		b, err := blobOf(desc)
		if err != nil {
			return err
		}
		blobs = append(blobs, b)
	}
	if changed {
		data, err := json.Marshal(man)
		if err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		mdesc := manifest.desc
		manifest = bytesBlob(v1.MediaTypeImageManifest, data)
		manifest.desc.Platform = mdesc.Platform
	}
	blobs = append(blobs, manifest)
	return writeAtomically(dst, func(w io.Writer) error { return writeLayout(w, name, manifest.desc, blobs) })
}

// writeLayout writes oci-layout, index.json (one image, named name) and the
// blobs, in that order.
func writeLayout(w io.Writer, name string, manifest v1.Descriptor, blobs []blob) error {
	manifest.Annotations = map[string]string{
		AnnotationImageName:  name,
		v1.AnnotationRefName: name,
	}
	idx := v1.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageIndex,
		Manifests: []v1.Descriptor{manifest},
	}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return fmt.Errorf("index: %w", err)
	}
	layoutJSON, err := json.Marshal(v1.ImageLayout{Version: v1.ImageLayoutVersion})
	if err != nil {
		return fmt.Errorf("oci-layout: %w", err)
	}
	tw := tar.NewWriter(w)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	if err := writeTarFile(tw, v1.ImageLayoutFile, 0o644, blob{data: layoutJSON, desc: v1.Descriptor{Size: int64(len(layoutJSON))}}); err != nil {
		return err
	}
	if err := writeTarFile(tw, v1.ImageIndexFile, 0o644, blob{data: idxJSON, desc: v1.Descriptor{Size: int64(len(idxJSON))}}); err != nil {
		return err
	}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].desc.Digest < blobs[j].desc.Digest })
	for _, b := range blobs {
		if err := writeTarFile(tw, path.Join("blobs", b.desc.Digest.Algorithm().String(), b.desc.Digest.Encoded()), 0o644, b); err != nil {
			return err
		}
	}
	return tw.Close()
}

// writeTarFile writes b as a regular file, checking that its content has
// b's size (and, for a blob with a digest, that digest).
func writeTarFile(tw *tar.Writer, name string, mode int64, b blob) error {
	rc, err := b.open()
	if err != nil {
		return err
	}
	defer func() { _ = rc.Close() }()
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: b.desc.Size, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	var r io.Reader = rc
	var verifier digest.Verifier
	if b.desc.Digest != "" {
		verifier = b.desc.Digest.Verifier()
		r = io.TeeReader(rc, verifier)
	}
	if _, err := io.Copy(tw, r); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if verifier != nil && !verifier.Verified() {
		return fmt.Errorf("%s: content does not match its digest", name)
	}
	return nil
}

// writeLayer writes the layer tar: each file's parent directories, then the
// file, all owned by root.
func writeLayer(w io.Writer, files []File) error {
	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	for _, f := range sorted {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return fmt.Errorf("file path %q is not a clean absolute path", f.Path)
		}
		rel := strings.TrimPrefix(f.Path, "/")
		var parents []string
		for d := path.Dir(rel); d != "."; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		info, err := os.Stat(f.Source)
		if err != nil {
			return fmt.Errorf("file %s: %w", f.Path, err)
		}
		if !info.Mode().IsRegular() {
			return fmt.Errorf("file %s: source %s is not a regular file", f.Path, f.Source)
		}
		if err := writeTarFile(tw, rel, int64(f.Mode.Perm()), blob{file: f.Source, desc: v1.Descriptor{Size: info.Size()}}); err != nil {
			return err
		}
	}
	return tw.Close()
}

// checkName accepts a full reference with a registry host and a tag, which
// is what the manifests name and what the importer takes as is.
func checkName(name string) error {
	host, _, hasRepo := strings.Cut(name, "/")
	// As in Docker's references: the first part names a registry when it
	// has a dot or a port, or is localhost.
	registry := hasRepo && (strings.ContainsAny(host, ".:") || host == "localhost")
	colon := strings.LastIndex(name, ":")
	if !registry || colon < len(host) || colon == len(name)-1 || strings.ContainsAny(name, " \t\n@") {
		return fmt.Errorf("image name %q is not a full reference (registry/repository:tag)", name)
	}
	return nil
}

func readIndexFile(p string) (v1.Index, error) {
	var idx v1.Index
	data, err := os.ReadFile(p)
	if err != nil {
		return idx, err
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return idx, fmt.Errorf("%s: %w", p, err)
	}
	return idx, nil
}

// writeAtomically writes dst through a temporary file in its directory.
func writeAtomically(dst string, write func(io.Writer) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
