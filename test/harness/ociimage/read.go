package ociimage

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	digest "github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// Layout is an OCI image layout directory holding one image.
type Layout struct {
	Dir string
	// Names are the image's names from its index entry: the
	// containerd name first, then the OCI ref name when it differs.
	Names    []string
	Index    v1.Index
	Manifest v1.Manifest
	Config   v1.Image
}

// Extract unpacks the archive at archive (as Write makes it, or `buildah
// push ... oci-archive:`) into dir, which must exist, and reads it.
func Extract(archive, dir string) (*Layout, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", archive, err)
		}
		name := path.Clean(hdr.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return nil, fmt.Errorf("%s: entry %q leaves the layout", archive, hdr.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return nil, err
			}
			if err := copyToFile(dst, tr, 0o644); err != nil {
				return nil, fmt.Errorf("%s: %w", archive, err)
			}
		default:
			return nil, fmt.Errorf("%s: entry %q has type %q; a layout holds only files and directories", archive, hdr.Name, hdr.Typeflag)
		}
	}
	return ReadLayout(dir)
}

// ReadLayout reads the layout in dir, checking that it holds one image
// whose manifest and config match their digests.
func ReadLayout(dir string) (*Layout, error) {
	l := &Layout{Dir: dir}
	idx, err := readIndexFile(filepath.Join(dir, v1.ImageIndexFile))
	if err != nil {
		return nil, err
	}
	l.Index = idx
	if len(idx.Manifests) != 1 {
		return nil, fmt.Errorf("%s holds %d images, want one", dir, len(idx.Manifests))
	}
	md := idx.Manifests[0]
	for _, a := range []string{AnnotationImageName, v1.AnnotationRefName} {
		if n := md.Annotations[a]; n != "" && (len(l.Names) == 0 || l.Names[0] != n) {
			l.Names = append(l.Names, n)
		}
	}
	if err := l.readJSON(md, &l.Manifest); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if err := l.readJSON(l.Manifest.Config, &l.Config); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(l.Config.RootFS.DiffIDs) != len(l.Manifest.Layers) {
		return nil, fmt.Errorf("%s: config lists %d layers, the manifest %d", dir, len(l.Config.RootFS.DiffIDs), len(l.Manifest.Layers))
	}
	return l, nil
}

func (l *Layout) blobPath(d digest.Digest) (string, error) {
	if err := d.Validate(); err != nil {
		return "", err
	}
	return filepath.Join(l.Dir, "blobs", d.Algorithm().String(), d.Encoded()), nil
}

// readJSON decodes the blob of desc after checking its size and digest.
func (l *Layout) readJSON(desc v1.Descriptor, v any) error {
	p, err := l.blobPath(desc.Digest)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if int64(len(data)) != desc.Size || digest.FromBytes(data) != desc.Digest {
		return fmt.Errorf("blob %s does not match its descriptor", desc.Digest)
	}
	return json.Unmarshal(data, v)
}

// Unpack applies the image's layers in order onto root (an empty
// directory): the image's filesystem, as a runtime would see it. Layer
// digests and diff IDs are checked; whiteouts remove what lower layers
// made. Ownership and device nodes are kept only when running as root.
func (l *Layout) Unpack(root string) error {
	for i, desc := range l.Manifest.Layers {
		if err := l.applyLayer(root, desc, l.Config.RootFS.DiffIDs[i]); err != nil {
			return fmt.Errorf("layer %d (%s): %w", i, desc.Digest, err)
		}
	}
	return nil
}

func (l *Layout) applyLayer(root string, desc v1.Descriptor, diffID digest.Digest) error {
	return l.readLayer(desc, diffID, func(r io.Reader) error { return applyTar(root, r) })
}

// inflate writes the layer's tar, uncompressed, to w.
func (l *Layout) inflate(desc v1.Descriptor, diffID digest.Digest, w io.Writer) error {
	return l.readLayer(desc, diffID, func(r io.Reader) error {
		_, err := io.Copy(w, r)
		return err
	})
}

// readLayer hands the layer's uncompressed tar stream to use, then checks
// the blob against its digest and the stream against the diff ID.
func (l *Layout) readLayer(desc v1.Descriptor, diffID digest.Digest, use func(io.Reader) error) error {
	p, err := l.blobPath(desc.Digest)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	blobCheck := desc.Digest.Verifier()
	r := io.TeeReader(f, blobCheck)
	switch desc.MediaType {
	case v1.MediaTypeImageLayer:
	case v1.MediaTypeImageLayerGzip, "application/vnd.docker.image.rootfs.diff.tar.gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		defer func() { _ = zr.Close() }()
		r = zr
	default:
		return fmt.Errorf("layer media type %q is not supported", desc.MediaType)
	}
	diffCheck := diffID.Verifier()
	if err := use(io.TeeReader(r, diffCheck)); err != nil {
		return err
	}
	// Read what tar's end-of-archive left, so both digests cover it all.
	if _, err := io.Copy(diffCheck, r); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, f); err != nil {
		return err
	}
	if !blobCheck.Verified() {
		return errors.New("the blob does not match its digest")
	}
	if !diffCheck.Verified() {
		return errors.New("the layer does not match the config's diff ID")
	}
	return nil
}

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// applyTar writes one layer's entries under root.
func applyTar(root string, r io.Reader) error {
	asRoot := os.Geteuid() == 0
	// made holds what this layer wrote, which an opaque whiteout in the same
	// layer keeps.
	made := map[string]bool{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + hdr.Name)
		if name == "/" {
			continue
		}
		dir, base := path.Split(name)
		parent, err := ResolveInRoot(root, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return err
		}
		switch {
		case base == whiteoutOpaque:
			entries, err := os.ReadDir(parent)
			if err != nil {
				return err
			}
			for _, e := range entries {
				if !made[path.Join(dir, e.Name())] {
					if err := os.RemoveAll(filepath.Join(parent, e.Name())); err != nil {
						return err
					}
				}
			}
			continue
		case strings.HasPrefix(base, whiteoutPrefix):
			if err := os.RemoveAll(filepath.Join(parent, strings.TrimPrefix(base, whiteoutPrefix))); err != nil {
				return err
			}
			continue
		}
		dst := filepath.Join(parent, base)
		made[name] = true
		mode := hdr.FileInfo().Mode()
		if hdr.Typeflag != tar.TypeDir {
			// A lower layer's entry of another type goes; a directory stays
			// only if this one is a directory too.
			if err := os.RemoveAll(dst); err != nil {
				return err
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(dst); err == nil && !fi.IsDir() {
				if err := os.Remove(dst); err != nil {
					return err
				}
			}
			if err := os.Mkdir(dst, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
		case tar.TypeReg:
			if err := copyToFile(dst, tr, 0o600); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, dst); err != nil {
				return err
			}
		case tar.TypeLink:
			target, err := ResolveInRoot(root, path.Clean("/"+hdr.Linkname))
			if err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
			if err := os.Link(target, dst); err != nil {
				return err
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			if !asRoot {
				continue
			}
			kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
			if err := unix.Mknod(dst, kind|uint32(mode.Perm()), int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
		default:
			return fmt.Errorf("%s: entry type %q is not supported", hdr.Name, hdr.Typeflag)
		}
		if asRoot {
			if err := os.Lchown(dst, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
		}
		if hdr.Typeflag != tar.TypeSymlink {
			// After chown, which clears setuid bits.
			if err := os.Chmod(dst, mode.Perm()|mode&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
				return err
			}
		}
	}
}

// ResolveInRoot returns the host path of p as a process chrooted into root
// sees it: symlinks, absolute or relative, resolve inside root and never
// leave it. Components after the last existing one are kept as they are.
func ResolveInRoot(root, p string) (string, error) {
	var resolved string // inside root, "" is "/"
	rest := strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/")
	for hops := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir("/" + resolved)
			resolved = strings.TrimPrefix(resolved, "/")
			continue
		}
		next := path.Join(resolved, c)
		fi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(next)))
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("too many symlinks resolving %s in %s", p, root)
		}
		target, err := os.Readlink(filepath.Join(root, filepath.FromSlash(next)))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			resolved = ""
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return filepath.Join(root, filepath.FromSlash(resolved)), nil
}

func copyToFile(dst string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
