//go:build deploytest

package deploy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/carve-csi/carve/test/harness/ociimage"
)

// The image archives are built by hack/images.sh, which prints their
// directory; make test-deploy passes it as CARVE_IMAGES.
func imagesDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CARVE_IMAGES")
	if dir == "" {
		t.Fatal("CARVE_IMAGES is not set: run `make test-deploy`, which builds the image archives with hack/images.sh and passes their directory")
	}
	return dir
}

// imageList reads images.txt: archive file -> image name.
func imageList(t *testing.T, dir string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "images.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			t.Fatalf("images.txt line %q is not NAME FILE", sc.Text())
		}
		m[f[1]] = f[0]
	}
	return m
}

// podSpecs are the pod templates of the base's workloads.
func podSpecs(t *testing.T) map[string]corev1.PodSpec {
	t.Helper()
	specs := map[string]corev1.PodSpec{}
	for key, o := range baseObjects(t) {
		switch w := o.(type) {
		case *appsv1.DaemonSet:
			specs[key] = w.Spec.Template.Spec
		case *appsv1.Deployment:
			specs[key] = w.Spec.Template.Spec
		}
	}
	if len(specs) == 0 {
		t.Fatal("the base renders no DaemonSet or Deployment")
	}
	return specs
}

// TestImageArchivesMatchTheManifests: every image the base runs has an
// archive named exactly as the manifest names it (containerd finds it by
// that name, so a pod starts with no registry), each archive carries the
// name images.txt gives it, and each entrypoint is in its image.
func TestImageArchivesMatchTheManifests(t *testing.T) {
	dir := imagesDir(t)
	list := imageList(t, dir)
	byName := map[string]string{}
	for file, name := range list {
		byName[name] = file
	}
	for key, spec := range podSpecs(t) {
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			if _, ok := byName[c.Image]; !ok {
				t.Errorf("%s container %s runs %s, for which images.txt lists no archive (it lists %v)", key, c.Name, c.Image, sortedKeys(byName))
			}
		}
	}
	if _, ok := byName["registry.k8s.io/pause:3.10"]; !ok {
		t.Errorf("no archive for the sandbox image registry.k8s.io/pause:3.10 (images.txt lists %v)", sortedKeys(byName))
	}
	for _, file := range sortedKeys(list) {
		t.Run(file, func(t *testing.T) {
			if file == "carve.tar" {
				// Large; TestCarveImage reads it.
				return
			}
			l, err := ociimage.Extract(filepath.Join(dir, file), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(l.Names, []string{list[file]}) {
				t.Errorf("%s is named %v, images.txt says %s", file, l.Names, list[file])
			}
			root := t.TempDir()
			if err := l.Unpack(root); err != nil {
				t.Fatal(err)
			}
			ep := l.Config.Config.Entrypoint
			want := "/" + strings.TrimSuffix(file, ".tar")
			if !slices.Equal(ep, []string{want}) {
				t.Errorf("entrypoint %v, want [%s] as upstream", ep, want)
			}
			if _, err := staticProgram(root, want); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestArchivesImportIntoContainerd imports every archive into a throwaway
// containerd (Debian's, the version the guest nodes run; its own root,
// state and socket, the native snapshotter, no CRI) as the guest does with
// `ctr -n k8s.io images import`, and checks each lands under the name
// images.txt gives: containerd 1.6 takes the name from
// io.containerd.image.name and would drop a bare OCI ref name.
func TestArchivesImportIntoContainerd(t *testing.T) {
	dir := imagesDir(t)
	list := imageList(t, dir)
	for _, p := range []string{"containerd", "ctr"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is missing: run make deps (hack/install-deps.sh installs Debian's containerd)", p)
		}
	}
	// A short base path: a unix socket's path is limited to 107 bytes.
	state, err := os.MkdirTemp("", "ctrd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	sock := filepath.Join(state, "sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(state, "root"), filepath.Join(state, "state"), sock, sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(state, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(state, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logFile.Close() }()
	ctrd := exec.Command("containerd", "--config", filepath.Join(state, "config.toml")) //nolint:noctx // a daemon for the whole test, stopped by its deferred cleanup
	ctrd.Stdout, ctrd.Stderr = logFile, logFile
	if err := ctrd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- ctrd.Wait() }()
	t.Cleanup(func() {
		if err := ctrd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("stopping containerd: %v", err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("containerd stopped with %v on SIGTERM", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("containerd still ran 10 s after SIGTERM; killed: %v", ctrd.Process.Kill())
			if err := <-exited; err == nil {
				t.Error("a killed containerd exited 0")
			}
		}
	})
	ctr := func(args ...string) ([]byte, error) {
		return runErr(state, append([]string{"ctr", "--address", sock, "--namespace", "k8s.io"}, args...)...)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := ctr("version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile.Name())
			t.Fatalf("containerd did not answer within 20 s; its log:\n%s", log)
		}
	}

	var want []string
	for _, file := range sortedKeys(list) {
		want = append(want, list[file])
		start := time.Now()
		if out, err := ctr("images", "import", "--snapshotter", "native", filepath.Join(dir, file)); err != nil {
			t.Errorf("importing %s: %v\n%s", file, err, out)
			continue
		}
		t.Logf("imported and unpacked %s in %v", file, time.Since(start).Round(time.Millisecond))
	}
	out, err := ctr("images", "list", "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Fields(string(out))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("containerd holds %v after the imports, want exactly %v", got, want)
	}
}

// staticProgram checks that p in root is an executable ELF file with no
// interpreter, and returns its host path.
func staticProgram(root, p string) (string, error) {
	host, err := ociimage.ResolveInRoot(root, p)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(host)
	if err != nil {
		return "", fmt.Errorf("%s is not in the image: %w", p, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file (%v)", p, fi.Mode())
	}
	interp, err := elfInterp(host)
	if err != nil {
		return "", fmt.Errorf("%s: %w", p, err)
	}
	if interp != "" {
		return "", fmt.Errorf("%s is dynamically linked (%s); the image has no libraries", p, interp)
	}
	return host, nil
}

// elfInterp returns an ELF file's program interpreter, "" for a static one.
func elfInterp(p string) (string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			data := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(data, 0); err != nil {
				return "", err
			}
			return string(bytes.TrimRight(data, "\x00")), nil
		}
	}
	return "", nil
}

// TestCarveImage looks inside the carve image that make image built.
func TestCarveImage(t *testing.T) {
	dir := imagesDir(t)
	l, err := ociimage.Extract(filepath.Join(dir, "carve.tar"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if want := imageList(t, dir)["carve.tar"]; !slices.Equal(l.Names, []string{want}) || want != pinnedImages["carve"] {
		t.Errorf("carve.tar is named %v, images.txt says %s, the manifests run %s", l.Names, want, pinnedImages["carve"])
	}
	root := t.TempDir()
	if err := l.Unpack(root); err != nil {
		t.Fatal(err)
	}

	// The build records the Dockerfile it was given; its content must be
	// this repository's, as it is now (a stale build fails here). The path
	// may differ: the image cache is keyed by content, so a clone elsewhere
	// reuses an image built from an identical Dockerfile.
	t.Run("built from the repository's Dockerfile", func(t *testing.T) {
		rec, err := os.ReadFile(filepath.Join(dir, "Dockerfile.sha256"))
		if err != nil {
			t.Fatal(err)
		}
		sum, file, _ := strings.Cut(strings.TrimSpace(string(rec)), "  ")
		want := filepath.Join(repoRoot(t), "Dockerfile")
		data, err := os.ReadFile(want)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(data)
		if sum != hex.EncodeToString(h[:]) {
			t.Errorf("the image was built from %s (sha256 %s); this repository's Dockerfile is %s (sha256 %x): run make image", file, sum, want, h)
		}
	})

	t.Run("has the Dockerfile's entrypoint and packages", func(t *testing.T) {
		if ep := l.Config.Config.Entrypoint; !slices.Equal(ep, []string{"/usr/local/bin/carve"}) {
			t.Errorf("entrypoint %v, want the Dockerfile's [/usr/local/bin/carve]", ep)
		}
		_, pkgs := dockerfilePackages(t)
		installed := dpkgInstalled(t, root)
		for _, p := range sortedKeys(pkgs) {
			if !installed[p] {
				t.Errorf("the Dockerfile installs %s; the image does not have it", p)
			}
		}
	})

	// Every program carve runs, found as the image's PATH finds it, and
	// loadable: the image's own dynamic loader resolves its libraries.
	t.Run("has every program carve runs", func(t *testing.T) {
		// The programs the manifests run from carve's image: the
		// entrypoint, or a container's command (carve-node).
		for _, prog := range manifestPrograms(t) {
			host, err := ociimage.ResolveInRoot(root, prog)
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(host); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
				t.Errorf("the manifests run %s from carve's image; the image has no such program (%v)", prog, err)
			} else if err := loadable(root, l, prog); err != nil {
				t.Error(err)
			}
		}
		pathDirs := imagePath(t, l)
		for _, prog := range sortedKeys(requiredPrograms(t)) {
			found := ""
			for _, d := range pathDirs {
				host, err := ociimage.ResolveInRoot(root, path.Join(d, prog))
				if err != nil {
					t.Fatal(err)
				}
				if fi, err := os.Stat(host); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
					found = path.Join(d, prog)
					break
				}
			}
			if found == "" {
				t.Errorf("%s is not in the image's PATH %v", prog, pathDirs)
				continue
			}
			if err := loadable(root, l, found); err != nil {
				t.Errorf("%s: %v", prog, err)
			}
		}
	})

	t.Run("runs carve version", func(t *testing.T) {
		out, err := inImage(root, l, append(slices.Clone(l.Config.Config.Entrypoint), "version")...)
		if err != nil || !strings.HasPrefix(string(out), "carve ") {
			t.Errorf("carve version in the image: %q, %v", out, err)
		}
	})
	// The node DaemonSets run carve-node (its command), which has the
	// plugin role and not the controller's.
	t.Run("runs carve-node version", func(t *testing.T) {
		out, err := inImage(root, l, nodeAgentProgram, "version")
		if err != nil || !strings.HasPrefix(string(out), "carve ") {
			t.Errorf("carve-node version in the image: %q, %v", out, err)
		}
		out, err = inImage(root, l, nodeAgentProgram, "controller")
		if err == nil || !strings.Contains(string(out), "not in carve-node") {
			t.Errorf("carve-node controller in the image: %q, %v; want it refused, naming the carve binary", out, err)
		}
	})
	t.Run("runs lvm", func(t *testing.T) {
		out, err := inImage(root, l, "lvm", "version")
		if err != nil || !bytes.Contains(out, []byte("LVM version")) {
			t.Errorf("lvm version in the image: %q, %v", out, err)
		}
	})
}

// manifestPrograms are the programs the base's containers run from
// carve's image: their command's program, or the image's entrypoint when
// they give none.
func manifestPrograms(t *testing.T) []string {
	t.Helper()
	progs := map[string]bool{}
	for _, spec := range podSpecs(t) {
		for _, c := range spec.Containers {
			switch {
			case c.Image != pinnedImages["carve"]:
			case len(c.Command) > 2 && c.Command[0] == "/usr/bin/tini" && c.Command[1] == "--":
				// tini, and the program it runs.
				progs[c.Command[0]], progs[c.Command[2]] = true, true
			case len(c.Command) > 0:
				progs[c.Command[0]] = true
			default:
				progs["/usr/local/bin/carve"] = true
			}
		}
	}
	if !progs[nodeAgentProgram] {
		t.Errorf("no container of the base runs %s", nodeAgentProgram)
	}
	return sortedKeys(progs)
}

// loadable checks that the program p of the image can start there: a
// script's interpreter is in the image and loadable, and an ELF program's
// libraries resolve with the image's own dynamic loader.
func loadable(root string, l *ociimage.Layout, p string) error {
	host, err := ociimage.ResolveInRoot(root, p)
	if err != nil {
		return err
	}
	f, err := os.Open(host)
	if err != nil {
		return err
	}
	head := make([]byte, 256)
	n, _ := f.Read(head)
	_ = f.Close()
	if line, ok := bytes.CutPrefix(head[:n], []byte("#!")); ok {
		line, _, _ = bytes.Cut(line, []byte("\n"))
		words := strings.Fields(string(line))
		if len(words) == 0 {
			return fmt.Errorf("%s: a #! line without an interpreter", p)
		}
		if err := loadable(root, l, words[0]); err != nil {
			return fmt.Errorf("%s: its interpreter: %w", p, err)
		}
		return nil
	}
	interp, err := elfInterp(host)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if interp == "" {
		return nil
	}
	out, err := inImage(root, l, interp, "--list", p)
	if err != nil || bytes.Contains(out, []byte("not found")) {
		return fmt.Errorf("%s cannot load its libraries in the image: %w\n%s", p, err, out)
	}
	return nil
}

// imagePath is the PATH of the image's config.
func imagePath(t *testing.T, l *ociimage.Layout) []string {
	t.Helper()
	for _, e := range l.Config.Config.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			return strings.Split(v, ":")
		}
	}
	t.Fatalf("the image's config sets no PATH (env %v)", l.Config.Config.Env)
	return nil
}

// inImage runs argv chrooted into root with the image's environment (as
// root, as the DaemonSet runs it) and returns its combined output. A bare
// program name is looked up in the image's PATH.
func inImage(root string, l *ociimage.Layout, argv ...string) ([]byte, error) {
	prog := argv[0]
	if !strings.HasPrefix(prog, "/") {
		for _, e := range l.Config.Config.Env {
			v, ok := strings.CutPrefix(e, "PATH=")
			if !ok {
				continue
			}
			for _, d := range strings.Split(v, ":") {
				if host, err := ociimage.ResolveInRoot(root, path.Join(d, prog)); err == nil {
					if _, err := os.Stat(host); err == nil {
						prog = path.Join(d, prog)
						break
					}
				}
			}
		}
	}
	cmd := exec.Command(prog, argv[1:]...) //nolint:noctx // the timeout below kills it and says so
	cmd.Dir = "/"
	cmd.Env = l.Config.Config.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s in the image: %w", strings.Join(argv, " "), err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.Bytes(), fmt.Errorf("%s in the image: %w", strings.Join(argv, " "), err)
		}
		return out.Bytes(), nil
	case <-time.After(time.Minute):
		if err := cmd.Process.Kill(); err != nil {
			return out.Bytes(), fmt.Errorf("%s in the image: still running after a minute, and kill failed: %w", strings.Join(argv, " "), err)
		}
		return out.Bytes(), fmt.Errorf("%s in the image: still running after a minute, killed: %w", strings.Join(argv, " "), <-done)
	}
}

// dpkgInstalled reads the packages installed in an image's dpkg database.
func dpkgInstalled(t *testing.T, root string) map[string]bool {
	t.Helper()
	status, err := ociimage.ResolveInRoot(root, "/var/lib/dpkg/status")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(status)
	if err != nil {
		t.Fatal(err)
	}
	installed := map[string]bool{}
	for _, para := range strings.Split(string(data), "\n\n") {
		var name, state string
		for _, line := range strings.Split(para, "\n") {
			if v, ok := strings.CutPrefix(line, "Package: "); ok {
				name = v
			}
			if v, ok := strings.CutPrefix(line, "Status: "); ok {
				state = v
			}
		}
		if name != "" && state == "install ok installed" {
			installed[name] = true
		}
	}
	return installed
}
