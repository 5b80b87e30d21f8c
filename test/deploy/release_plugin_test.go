//go:build deploytest

package deploy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// rcVersion is the release candidate whose artifacts the tests build: the
// release workflow run as far as it goes without a registry.
const rcVersion = "v0.1.0-rc.1"

const rcChangelog = "# Changelog\n\n## [0.1.0-rc.1]\n\n- the first release candidate\n"

// krewManifest is the part of krew's plugin manifest
// (krew.googlecontainertools.github.com/v1alpha2 Plugin) a release fills in.
type krewManifest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			Sha256 string `json:"sha256"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
			Bin string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestReleasePlugin: the artifacts of v0.1.0-rc.1 hold a kubectl-carve
// archive per platform (the binary built for that platform, the
// completion helper, the license), krew's manifest of them (each
// platform's URL in the release and the archive's sha256) and all of it in
// SHA256SUMS; krew installs the manifest from this platform's archive, and
// the installed plugin and its completion helper run.
func TestReleasePlugin(t *testing.T) {
	dist, out, err := release(t, rcVersion, rcChangelog)
	if err != nil {
		t.Fatalf("release artifacts: %v\n%s", err, out)
	}
	platforms := []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"}
	want := []string{"RELEASE_NOTES.md", "SHA256SUMS", "carve-0.1.0-rc.1.tgz", "carve-" + rcVersion + ".yaml", "carve.krew.yaml", "index.yaml"}
	for _, p := range platforms {
		want = append(want, archiveName(p))
	}
	entries, err := os.ReadDir(dist)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("dist holds %q, want %q", got, want)
	}
	sums, err := runErr(dist, "sha256sum", "--check", "--strict", "SHA256SUMS")
	if err != nil || bytes.Count(sums, []byte(": OK")) != len(want)-2 {
		t.Errorf("SHA256SUMS does not cover every artifact but itself and the notes (%v):\n%s", err, sums)
	}

	raw, err := os.ReadFile(filepath.Join(dist, "carve.krew.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m krewManifest
	if err := yaml.UnmarshalStrict(raw, &m); err != nil {
		t.Fatalf("carve.krew.yaml: %v\n%s", err, raw)
	}
	if m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || m.Kind != "Plugin" || m.Metadata.Name != "carve" ||
		m.Spec.Version != rcVersion || m.Spec.ShortDescription == "" || m.Spec.Homepage == "" {
		t.Errorf("carve.krew.yaml: apiVersion %q kind %q name %q version %q shortDescription %q homepage %q; want krew's v1alpha2 Plugin carve at %s with a description",
			m.APIVersion, m.Kind, m.Metadata.Name, m.Spec.Version, m.Spec.ShortDescription, m.Spec.Homepage, rcVersion)
	}
	if !strings.Contains(m.Spec.Caveats, "store/carve/"+rcVersion+"/kubectl_complete-carve") {
		t.Errorf("the caveats do not say where the completion helper is:\n%s", m.Spec.Caveats)
	}
	var covered []string
	for _, p := range m.Spec.Platforms {
		platform := p.Selector.MatchLabels["os"] + "/" + p.Selector.MatchLabels["arch"]
		covered = append(covered, platform)
		name := archiveName(platform)
		if wantURI := "https://github.com/carve-csi/carve/releases/download/" + rcVersion + "/" + name; p.URI != wantURI {
			t.Errorf("%s: uri %s, want %s", platform, p.URI, wantURI)
		}
		archive, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Errorf("%s: %v", platform, err)
			continue
		}
		if sum := sha256.Sum256(archive); p.Sha256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: sha256 %s, the archive's is %x", platform, p.Sha256, sum)
		}
		var files []string
		for _, f := range p.Files {
			files = append(files, f.From+"->"+f.To)
		}
		if p.Bin != "kubectl-carve" || !slices.Equal(files, []string{"kubectl-carve->.", "kubectl_complete-carve->.", "LICENSE->."}) {
			t.Errorf("%s: bin %q, files %q; want kubectl-carve, and the binary, the completion helper and the license", platform, p.Bin, files)
		}
		checkArchive(t, platform, archive)
	}
	if slices.Sort(covered); !slices.Equal(covered, slices.Sorted(slices.Values(platforms))) {
		t.Errorf("the krew manifest covers %q, want %q", covered, platforms)
	}

	// krew itself: its manifest validation, the sha256 of the archive,
	// the files it extracts and the link it makes.
	host := runtime.GOOS + "/" + runtime.GOARCH
	if !slices.Contains(platforms, host) {
		t.Skipf("no archive for this machine's %s to install", host)
	}
	krewRoot := t.TempDir()
	krew := func(archive string) ([]byte, error) {
		cmd := exec.CommandContext(t.Context(), tool(t, "krew"), "install", "--manifest="+filepath.Join(dist, "carve.krew.yaml"), "--archive="+archive)
		cmd.Env = append(os.Environ(), "KREW_ROOT="+krewRoot, "KREW_NO_UPGRADE_CHECK=1")
		return cmd.CombinedOutput()
	}
	// An archive that is not the one the manifest names is refused.
	other := filepath.Join(t.TempDir(), "other.tar.gz")
	if err := os.WriteFile(other, append(mustRead(t, filepath.Join(dist, archiveName(host))), 0), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := krew(other); err == nil {
		t.Errorf("krew installed an archive whose sha256 the manifest does not name:\n%s", out)
	}
	if out, err := krew(filepath.Join(dist, archiveName(host))); err != nil {
		t.Fatalf("krew install: %v\n%s", err, out)
	}
	bin := filepath.Join(krewRoot, "bin")
	if out, err := runErr(bin, filepath.Join(bin, "kubectl-carve"), "--help"); err != nil || !strings.Contains(string(out), "describe") {
		t.Errorf("the installed kubectl-carve --help: %v\n%s", err, out)
	}
	// The caveats' step, then completion as kubectl runs it.
	helper := filepath.Join(krewRoot, "store", "carve", rcVersion, "kubectl_complete-carve")
	if err := os.Link(helper, filepath.Join(bin, "kubectl_complete-carve")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), filepath.Join(bin, "kubectl_complete-carve"), "des")
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "describe") {
		t.Errorf("kubectl_complete-carve des: %v, %q; want describe among the completions", err, out)
	}
}

func archiveName(platform string) string {
	return "kubectl-carve-" + rcVersion + "-" + strings.ReplaceAll(platform, "/", "-") + ".tar.gz"
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkArchive: the archive holds exactly the binary, built for platform,
// the executable completion helper and the license.
func checkArchive(t *testing.T, platform string, archive []byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatalf("%s: %v", platform, err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", platform, err)
		}
		names = append(names, h.Name)
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("%s: %v", platform, err)
		}
		switch h.Name {
		case "kubectl-carve":
			if got := binaryPlatform(body); got != platform {
				t.Errorf("%s: kubectl-carve is built for %q", platform, got)
			}
			fallthrough
		case "kubectl_complete-carve":
			if h.Mode&0o111 != 0o111 {
				t.Errorf("%s: %s has mode %o, want executable", platform, h.Name, h.Mode)
			}
		}
	}
	if !slices.Equal(names, []string{"kubectl-carve", "kubectl_complete-carve", "LICENSE"}) {
		t.Errorf("%s: the archive holds %q", platform, names)
	}
}

// binaryPlatform reads os/arch from an ELF or Mach-O header.
func binaryPlatform(b []byte) string {
	if f, err := elf.NewFile(bytes.NewReader(b)); err == nil {
		switch f.Machine {
		case elf.EM_X86_64:
			return "linux/amd64"
		case elf.EM_AARCH64:
			return "linux/arm64"
		}
		return "linux/" + f.Machine.String()
	}
	if f, err := macho.NewFile(bytes.NewReader(b)); err == nil {
		switch f.Cpu {
		case macho.CpuAmd64:
			return "darwin/amd64"
		case macho.CpuArm64:
			return "darwin/arm64"
		}
		return "darwin/" + f.Cpu.String()
	}
	return "unknown"
}
