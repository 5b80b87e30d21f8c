package guestvm

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Kernel is a Debian kernel the guest boots, with the module tree of the
// same version (the guest loads its modules from the host's /lib/modules
// through the shared root, so the versions must match).
type Kernel struct {
	Version    string
	Image      string // /boot/vmlinuz-<version>
	ModulesDir string // /lib/modules/<version>
}

// FindKernel returns the newest kernel under bootDir (normally /boot) that
// has a module tree with a modules.dep under modulesRoot (normally
// /lib/modules). The version is never hard-coded: Debian's updates change it.
func FindKernel(bootDir, modulesRoot string) (Kernel, error) {
	images, err := filepath.Glob(filepath.Join(bootDir, "vmlinuz-*"))
	if err != nil {
		return Kernel{}, err
	}
	var found []Kernel
	for _, img := range images {
		ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		mods := filepath.Join(modulesRoot, ver)
		if _, err := os.Stat(filepath.Join(mods, "modules.dep")); err != nil {
			continue
		}
		found = append(found, Kernel{Version: ver, Image: img, ModulesDir: mods})
	}
	if len(found) == 0 {
		return Kernel{}, fmt.Errorf("guestvm: no guest kernel: need %s/vmlinuz-<ver> with a matching %s/<ver>/modules.dep "+
			"(found images %v); install the Debian package linux-image-amd64 (hack/install-deps.sh does)", bootDir, modulesRoot, images)
	}
	sort.Slice(found, func(i, j int) bool { return versionLess(found[i].Version, found[j].Version) })
	return found[len(found)-1], nil
}

// versionLess compares kernel versions such as 6.1.0-9-amd64 and
// 6.1.0-56-amd64 field by field, numerically where both fields are numbers.
func versionLess(a, b string) bool {
	split := func(s string) []string {
		return strings.FieldsFunc(s, func(r rune) bool { return r == '.' || r == '-' || r == '+' })
	}
	fa, fb := split(a), split(b)
	for i := 0; i < len(fa) && i < len(fb); i++ {
		if fa[i] == fb[i] {
			continue
		}
		var na, nb int
		_, ea := fmt.Sscanf(fa[i], "%d", &na)
		_, eb := fmt.Sscanf(fb[i], "%d", &nb)
		if ea == nil && eb == nil && na != nb {
			return na < nb
		}
		return fa[i] < fb[i]
	}
	return len(fa) < len(fb)
}

// moduleName normalizes a module name or .ko path the way kmod does:
// basename without .ko*, dashes as underscores.
func moduleName(s string) string {
	s = filepath.Base(s)
	if i := strings.Index(s, ".ko"); i >= 0 {
		s = s[:i]
	}
	return strings.ReplaceAll(s, "-", "_")
}

// ResolveModules returns the .ko files (relative to the module tree) that
// loading the named modules needs, dependencies first, each once, in the
// order insmod must load them. Modules built into the kernel
// (modules.builtin) are left out. It reads modules.dep instead of running
// modprobe so that it needs nothing but the files.
func (k Kernel) ResolveModules(names []string) ([]string, error) {
	deps, err := readModulesDep(filepath.Join(k.ModulesDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if f, err := os.Open(filepath.Join(k.ModulesDir, "modules.builtin")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			builtin[moduleName(sc.Text())] = true
		}
		if err := errors.Join(sc.Err(), f.Close()); err != nil {
			return nil, fmt.Errorf("guestvm: reading modules.builtin: %w", err)
		}
	}
	var order []string
	seen := map[string]bool{}
	add := func(path string) {
		if !seen[path] {
			seen[path] = true
			order = append(order, path)
		}
	}
	for _, n := range names {
		n = moduleName(n)
		if builtin[n] {
			continue
		}
		e, ok := deps[n]
		if !ok {
			return nil, fmt.Errorf("guestvm: kernel module %s is not in %s/modules.dep", n, k.ModulesDir)
		}
		// modules.dep lists the full dependency closure with the module
		// loaded last first; load it from the end.
		for i := len(e.deps) - 1; i >= 0; i-- {
			add(e.deps[i])
		}
		add(e.path)
	}
	for _, p := range order {
		if !strings.HasSuffix(p, ".ko") {
			return nil, fmt.Errorf("guestvm: module %s is compressed; the initramfs's busybox insmod needs plain .ko files", p)
		}
	}
	return order, nil
}

type depEntry struct {
	path string
	deps []string
}

func readModulesDep(file string) (map[string]depEntry, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("guestvm: reading module dependencies: %w", err)
	}
	out := map[string]depEntry{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		out[moduleName(mod)] = depEntry{path: mod, deps: strings.Fields(rest)}
	}
	if err := errors.Join(sc.Err(), f.Close()); err != nil {
		return nil, fmt.Errorf("guestvm: reading %s: %w", file, err)
	}
	return out, nil
}

// findBusybox returns the path of a statically linked busybox: the
// initramfs has no C library for a dynamic one.
func findBusybox(candidates ...string) (string, error) {
	for _, p := range candidates {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		static := true
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				static = false
			}
		}
		if err := f.Close(); err != nil {
			return "", fmt.Errorf("guestvm: reading %s: %w", p, err)
		}
		if static {
			return p, nil
		}
	}
	return "", errors.New("guestvm: no statically linked busybox (looked at " + strings.Join(candidates, ", ") +
		"); install the Debian package busybox-static (hack/install-deps.sh does)")
}
