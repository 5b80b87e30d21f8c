//go:build deploytest

package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// filesystems are the filesystems carve formats and grows (docs/configuration.md).
var filesystems = []string{"ext4", "xfs", "btrfs"}

// execSite is one place that runs a program.
type execSite struct {
	pos string
	// program is the program's name, or its prefix when prefix is set
	// ("mkfs." + fstype).
	program string
	prefix  bool
	// dynamic names the expression when the program is not a constant.
	dynamic string
}

// execSites finds the calls of Command/CommandContext in the Go files of
// dirs (recursively) that keep accepts, and resolves their program argument
// from string literals and package-level string constants/variables.
func execSites(t *testing.T, dirs []string, keep func(path string) bool) []execSite {
	t.Helper()
	var sites []execSite
	for _, dir := range dirs {
		pkgs := map[string][]*ast.File{}
		fset := token.NewFileSet()
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || !keep(path) {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			pkgs[filepath.Dir(path)] = append(pkgs[filepath.Dir(path)], f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, files := range pkgs {
			consts := map[string]string{}
			for _, f := range files {
				for _, decl := range f.Decls {
					gd, ok := decl.(*ast.GenDecl)
					if !ok {
						continue
					}
					for _, spec := range gd.Specs {
						vs, ok := spec.(*ast.ValueSpec)
						if !ok {
							continue
						}
						for i, name := range vs.Names {
							if i < len(vs.Values) {
								if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
									consts[name.Name], _ = strconv.Unquote(lit.Value)
								}
							}
						}
					}
				}
			}
			for _, f := range files {
				ast.Inspect(f, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					sel, ok := call.Fun.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					argi := -1
					switch sel.Sel.Name {
					case "Command":
						argi = 0
					case "CommandContext":
						argi = 1
					}
					if argi < 0 || len(call.Args) <= argi {
						return true
					}
					s := execSite{pos: fset.Position(call.Pos()).String()}
					switch a := call.Args[argi].(type) {
					case *ast.BasicLit:
						s.program, _ = strconv.Unquote(a.Value)
					case *ast.Ident:
						if v, ok := consts[a.Name]; ok {
							s.program = v
						} else {
							s.dynamic = a.Name
						}
					case *ast.BinaryExpr:
						if lit, ok := a.X.(*ast.BasicLit); ok && a.Op == token.ADD {
							s.program, _ = strconv.Unquote(lit.Value)
							s.prefix = true
						} else {
							s.dynamic = types(a)
						}
					default:
						s.dynamic = types(a)
					}
					sites = append(sites, s)
					return true
				})
			}
		}
	}
	return sites
}

func types(e ast.Expr) string {
	switch v := e.(type) {
	case *ast.SelectorExpr:
		return types(v.X) + "." + v.Sel.Name
	case *ast.Ident:
		return v.Name
	}
	return fmt.Sprintf("%T", e)
}

// dynamicPrograms resolves the call sites whose program is a variable, by
// the variable's name; each entry says where the value comes from.
var dynamicPrograms = map[string][]string{
	// lvm.runner: Options.Command, default "lvm" (internal/node/lvm/run.go).
	"r.command": {"lvm"},
	// internal/node/fs wraps mount-utils' exec: whatever mount-utils asks for, all
	// listed from mount-utils' own call sites below.
	"cmd": nil,
	// mount-utils: "mount", or "systemd-run" when it found systemd.
	"mountCmd": {"mount"},
	// mount-utils resizefs: blockdev.
	"blockDev": {"blockdev"},
	// changemap.Exec: the change finder of catch-ups and snapshot
	// metadata (internal/node/changemap).
	"program": {"dmsetup", "thin_delta", "thin_dump"},
}

// notInImage are programs that code paths can name but that carve never runs
// in its container, with the reason.
var notInImage = map[string]string{
	"systemd-run": "mount-utils probes for systemd with systemd-run and, when it is absent (as in the image), never runs mounts through it",
}

// extraPrograms are run by the programs above, not by carve itself.
func extraPrograms() map[string]string {
	m := map[string]string{
		// lvm2 checks a thin pool's metadata with thin_check when it
		// activates the pool (lvm.conf global/thin_check_executable).
		"thin_check": "lvm (thin pool activation)",
	}
	// fsck runs the fsck.<type> helper of the filesystem.
	for _, fs := range filesystems {
		m["fsck."+fs] = "fsck"
	}
	return m
}

// requiredPrograms gathers every program carve's container runs.
func requiredPrograms(t *testing.T) map[string]string {
	t.Helper()
	root := repoRoot(t)
	var carveDirs []string
	for _, d := range []string{"cmd", "api", "internal"} {
		if _, err := os.Stat(filepath.Join(root, d)); err == nil {
			carveDirs = append(carveDirs, filepath.Join(root, d))
		}
	}
	sites := execSites(t, carveDirs, func(string) bool { return true })

	out, err := runErr(root, "go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/mount-utils")
	if err != nil {
		t.Fatal(err)
	}
	mountUtils := strings.TrimSpace(string(out))
	otherOS := regexp.MustCompile(`_(windows|darwin|freebsd|unsupported|others)\.go$`)
	sites = append(sites, execSites(t, []string{mountUtils}, func(p string) bool {
		return filepath.Dir(p) == mountUtils && !otherOS.MatchString(p)
	})...)

	programs := map[string]string{}
	for _, s := range sites {
		switch {
		case s.dynamic != "":
			resolved, ok := dynamicPrograms[s.dynamic]
			if !ok {
				t.Errorf("%s runs a program named by %q, which this test cannot resolve: add it to dynamicPrograms", s.pos, s.dynamic)
			}
			for _, p := range resolved {
				programs[p] = s.pos
			}
		case s.prefix:
			if s.program != "mkfs." {
				t.Errorf("%s runs %q + something; only mkfs.<fstype> is known", s.pos, s.program)
				continue
			}
			for _, fs := range filesystems {
				programs["mkfs."+fs] = s.pos
			}
		default:
			programs[s.program] = s.pos
		}
	}
	for p, why := range extraPrograms() {
		programs[p] = why
	}
	for p := range notInImage {
		delete(programs, p)
	}
	return programs
}

// dockerfilePackages returns the runtime stage's base image and the Debian
// packages its apt-get install line installs.
func dockerfilePackages(t *testing.T) (base string, pkgs map[string]bool) {
	t.Helper()
	data := readRepoFile(t, "Dockerfile")
	base, pkgs, stages := parseDockerfile(data)
	if stages < 2 {
		t.Errorf("the Dockerfile has %d stages, want a build stage and a runtime stage", stages)
	}
	return base, pkgs
}

// parseDockerfile reads the last stage's base image (global ARGs expanded)
// and the packages of its `apt-get install` commands, and counts the stages.
func parseDockerfile(data []byte) (base string, pkgs map[string]bool, stages int) {
	// Join continuation lines into instructions; drop comments.
	var instrs []string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if l, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(l + " ")
			continue
		}
		cur.WriteString(line)
		if s := strings.TrimSpace(cur.String()); s != "" {
			instrs = append(instrs, s)
		}
		cur.Reset()
	}
	args := map[string]string{}
	pkgs = map[string]bool{}
	for _, in := range instrs {
		words := strings.Fields(in)
		switch strings.ToUpper(words[0]) {
		case "ARG":
			if k, v, ok := strings.Cut(words[1], "="); ok && stages == 0 {
				args[k] = v
			}
		case "FROM":
			stages++
			// The image is the first word that is not a flag (--platform).
			for _, w := range words[1:] {
				if !strings.HasPrefix(w, "--") {
					base = os.Expand(w, func(k string) string { return args[k] })
					break
				}
			}
			pkgs = map[string]bool{} // only the last stage counts
		case "RUN":
			for i, w := range words {
				if w != "install" || i == 0 || words[i-1] != "apt-get" && !strings.HasPrefix(words[i-1], "-") {
					continue
				}
				for _, p := range words[i+1:] {
					if p == "&&" || p == ";" {
						break
					}
					if !strings.HasPrefix(p, "-") {
						pkgs[p] = true
					}
				}
			}
		}
	}
	return base, pkgs, stages
}

func TestParseDockerfile(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		base       string
		pkgs       []string
		stages     int
	}{
		{"one stage", "FROM debian:bookworm-slim\nRUN apt-get install -y lvm2\n", "debian:bookworm-slim", []string{"lvm2"}, 1},
		{"continuations and options", "FROM x\nRUN apt-get update \\\n && apt-get install -y --no-install-recommends \\\n  a \\\n  b \\\n && rm -rf /var/lib/apt/lists/*\n", "x", []string{"a", "b"}, 1},
		{"only the last stage", "ARG R=bookworm\nFROM golang:1-${R} AS build\nRUN apt-get install -y gcc\nFROM debian:${R}-slim\n# a comment\nRUN apt-get install -y mount\n", "debian:bookworm-slim", []string{"mount"}, 2},
		{"not apt-get", "FROM x\nRUN pip install foo\n", "x", nil, 1},
		{"platform flag", "ARG R=bookworm\nFROM --platform=$BUILDPLATFORM golang:1-${R} AS build\nFROM --platform=linux/arm64 debian:${R}-slim\n", "debian:bookworm-slim", nil, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, pkgs, stages := parseDockerfile([]byte(tc.text))
			got := sortedKeys(pkgs)
			if len(got) == 0 {
				got = nil
			}
			if base != tc.base || stages != tc.stages || strings.Join(got, ",") != strings.Join(tc.pkgs, ",") {
				t.Errorf("got base %q, packages %v, %d stages; want %q, %v, %d", base, got, stages, tc.base, tc.pkgs, tc.stages)
			}
		})
	}
}

// packageOf maps a program to the Debian package that ships it on this host.
func packageOf(program string) (string, error) {
	var lastErr error
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		out, err := runErr("/", "dpkg", "-S", filepath.Join(dir, program))
		if err == nil {
			pkg, _, _ := strings.Cut(strings.TrimSpace(string(out)), ":")
			return pkg, nil
		}
		lastErr = err
	}
	return "", fmt.Errorf("no Debian package on this host ships %s (install it, or hack/install-deps.sh should): %w", program, lastErr)
}

// essentialPackages are in every Debian image, installed or not here.
func essentialPackages(t *testing.T) map[string]bool {
	out := run(t, "/", "dpkg-query", "-W", "-f", "${Package} ${Essential}\n")
	m := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if name, ess, ok := strings.Cut(line, " "); ok && ess == "yes" {
			m[name] = true
		}
	}
	return m
}

// TestImageProvidesEveryProgram: no container engine runs here, so the
// image is checked by what it installs: every program carve (or the
// library that mounts and formats for it) runs must come from a Debian
// package the runtime stage installs, or from an Essential one.
func TestImageProvidesEveryProgram(t *testing.T) {
	base, pkgs := dockerfilePackages(t)
	osRelease, err := os.ReadFile("/etc/os-release")
	if err != nil {
		t.Fatal(err)
	}
	codename := regexp.MustCompile(`(?m)^VERSION_CODENAME=(\w+)`).FindSubmatch(osRelease)
	if codename == nil || base != "debian:"+string(codename[1])+"-slim" {
		t.Fatalf("the runtime stage is %q; this check maps programs to packages with this host's dpkg (%s), so the image must be debian:<same release>-slim", base, codename)
	}
	essential := essentialPackages(t)
	programs := requiredPrograms(t)
	for _, must := range []string{"lvm", "mount", "umount", "blkid", "fsck", "mkfs.ext4", "mkfs.xfs", "mkfs.btrfs", "resize2fs", "xfs_growfs", "btrfs", "blockdev"} {
		if _, ok := programs[must]; !ok {
			t.Errorf("the scan of the sources did not find %s, which carve is known to run: the scan is broken", must)
		}
	}
	names := sortedKeys(programs)
	var table []string
	for _, p := range names {
		pkg, err := packageOf(p)
		if err != nil {
			t.Error(err)
			continue
		}
		table = append(table, fmt.Sprintf("%-12s %-24s (%s)", p, pkg, programs[p]))
		if !pkgs[pkg] && !essential[pkg] {
			t.Errorf("%s (run at %s) comes from package %s, which the Dockerfile does not install", p, programs[p], pkg)
		}
	}
	t.Logf("programs and their packages:\n%s", strings.Join(table, "\n"))
	var installed []string
	for p := range pkgs {
		installed = append(installed, p)
	}
	sort.Strings(installed)
	t.Logf("the runtime stage installs %v", installed)
}

// TestDockerfileBuildsStatically: the build stage makes static binaries of
// ./cmd/carve with the version stamped in, carve and carve-node (-tags
// nodeagent, the node agent's), and the image has both and runs carve.
func TestDockerfileBuildsStatically(t *testing.T) {
	data := readRepoFile(t, "Dockerfile")
	for _, want := range []string{
		"CGO_ENABLED=0 go build",
		// Multi-arch: the build stage cross-compiles for the target.
		"FROM --platform=$BUILDPLATFORM golang:",
		"GOOS=${TARGETOS} GOARCH=${TARGETARCH}",
		"-X github.com/carve-csi/carve/internal/version.Version=${VERSION}",
		"./cmd/carve",
		"COPY --from=build /out/carve /usr/local/bin/carve",
		"go build -trimpath -tags nodeagent,grpcnotrace",
		"-o /out/carve-node ./cmd/carve",
		"COPY --from=build /out/carve-node " + nodeAgentProgram,
		`ENTRYPOINT ["/usr/local/bin/carve"]`,
	} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("the Dockerfile lacks %q", want)
		}
	}
	goMod := readRepoFile(t, "go.mod")
	goVersion := regexp.MustCompile(`(?m)^go (\S+)`).FindSubmatch(goMod)
	if goVersion == nil || !bytes.Contains(data, []byte("ARG GO_VERSION="+string(goVersion[1]))) {
		t.Errorf("the Dockerfile's GO_VERSION is not go.mod's go %s", goVersion)
	}
}
