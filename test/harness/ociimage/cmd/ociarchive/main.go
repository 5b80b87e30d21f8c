// Command ociarchive writes OCI image archives that `ctr images import`
// takes under an exact name, with no container engine (package
// test/harness/ociimage):
//
//	ociarchive files -name NAME -o FILE HOSTPATH:IMAGEPATH...
//	    one layer holding the files (mode 0755), the first file as the
//	    entrypoint unless -entrypoint says otherwise
//	ociarchive layout -name NAME -o FILE [-uncompressed] DIR
//	    the one-image OCI layout in DIR (from `buildah push IMG oci:DIR`),
//	    named NAME; -uncompressed stores gzip layers inflated
//
// hack/images.sh uses it for the sidecar and pause images and to name
// carve's image.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/carve-csi/carve/test/harness/ociimage"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

const usage = "usage: ociarchive files -name NAME -o FILE [-entrypoint PATH] HOSTPATH:IMAGEPATH...\n" +
	"       ociarchive layout -name NAME -o FILE [-uncompressed] DIR\n"

// run is main without the exit: 0 on success, 2 for a usage error, 1 when
// writing failed.
func run(args []string, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "files" && args[0] != "layout") {
		_, _ = fmt.Fprint(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("ociarchive "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "the full image name (registry/repository:tag) to import the archive under")
	out := fs.String("o", "", "the archive to write (atomically)")
	var entrypoint *string
	var uncompressed *bool
	if args[0] == "files" {
		entrypoint = fs.String("entrypoint", "", "the entrypoint; default the first file's image path")
	} else {
		uncompressed = fs.Bool("uncompressed", false, "store gzip layers inflated (a guest under TCG imports them faster)")
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *name == "" || *out == "" || fs.NArg() == 0 || (args[0] == "layout" && fs.NArg() != 1) {
		_, _ = fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	if args[0] == "layout" {
		err = ociimage.WriteLayoutFile(*out, fs.Arg(0), *name, *uncompressed)
	} else {
		img := ociimage.Image{Name: *name}
		for _, a := range fs.Args() {
			src, dst, ok := strings.Cut(a, ":")
			if !ok || src == "" || dst == "" {
				_, _ = fmt.Fprintf(stderr, "ociarchive files: %q is not HOSTPATH:IMAGEPATH\n", a)
				return 2
			}
			img.Files = append(img.Files, ociimage.File{Path: dst, Mode: 0o755, Source: src})
		}
		img.Entrypoint = []string{img.Files[0].Path}
		if *entrypoint != "" {
			img.Entrypoint = []string{*entrypoint}
		}
		err = ociimage.WriteFile(*out, img)
	}
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "ociarchive %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
