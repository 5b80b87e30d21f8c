//go:build deploytest

package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// release runs hack/release.sh artifacts for version with a changelog of
// its own, into a temporary directory; env adds to the environment
// (PLATFORMS=...).
func release(t *testing.T, version, changelog string, env ...string) (dist string, out []byte, err error) {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	cl := filepath.Join(dir, "CHANGELOG.md")
	if err := os.WriteFile(cl, []byte(changelog), 0o600); err != nil {
		t.Fatal(err)
	}
	dist = filepath.Join(dir, "dist")
	tool(t, "helm")
	tool(t, "kustomize")
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "hack", "release.sh"), "artifacts")
	cmd.Dir = root
	cmd.Env = append(append(os.Environ(), "VERSION="+version, "DIST="+dist, "CHANGELOG="+cl), env...)
	out, err = cmd.CombinedOutput()
	return dist, out, err
}

// TestReleaseArtifacts: make release-artifacts makes, for a version, a chart
// archive of that version whose default image is that version's, its
// repository index, the manifests with that image, the version's
// CHANGELOG section as release notes and checksums of it all.
func TestReleaseArtifacts(t *testing.T) {
	const changelog = "# Changelog\n\n## [1.2.4]\n\n- later\n\n## [1.2.3] - 2026-11-23\n\n- a fix\n\n## [1.2.2]\n\n- older\n"
	// One platform here: TestReleasePlugin builds them all.
	dist, out, err := release(t, "v1.2.3", changelog, "PLATFORMS=linux/amd64")
	if err != nil {
		t.Fatalf("release artifacts: %v\n%s", err, out)
	}
	chart := filepath.Join(dist, "carve-1.2.3.tgz")
	meta := run(t, dist, tool(t, "helm"), "show", "chart", chart)
	var c struct{ Version, AppVersion string }
	if err := yaml.Unmarshal(meta, &c); err != nil || c.Version != "1.2.3" || c.AppVersion != "1.2.3" {
		t.Errorf("the chart archive says version %q, appVersion %q (%v), want 1.2.3", c.Version, c.AppVersion, err)
	}
	want := "ghcr.io/carve-csi/carve:v1.2.3"
	fromChart := byKey(t, decodeObjects(t, run(t, dist, tool(t, "helm"), "template", "carve", chart, "--namespace", namespace, "--kube-version", kubeVersion)))
	manifests, err := os.ReadFile(filepath.Join(dist, "carve-v1.2.3.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fromManifests := byKey(t, decodeObjects(t, manifests))
	for name, objs := range map[string]map[string]object{"the chart archive": fromChart, "the manifests": fromManifests} {
		ds, ok := typed(t, objs[nodeDS]).(*appsv1.DaemonSet)
		if !ok {
			t.Fatalf("%s render no %s", name, nodeDS)
		}
		if got := container(t, ds.Spec.Template.Spec, "carve").Image; got != want {
			t.Errorf("%s run image %s, want %s", name, got, want)
		}
	}
	if _, ok := fromManifests["Namespace /carve-system"]; !ok {
		t.Error("the manifests lack the Namespace")
	}
	index, err := os.ReadFile(filepath.Join(dist, "index.yaml"))
	if err != nil || !bytes.Contains(index, []byte("https://github.com/carve-csi/carve/releases/download/v1.2.3/carve-1.2.3.tgz")) {
		t.Errorf("index.yaml does not point at the release's archive (%v):\n%s", err, index)
	}
	notes, err := os.ReadFile(filepath.Join(dist, "RELEASE_NOTES.md"))
	if err != nil || strings.TrimSpace(string(notes)) != "- a fix" {
		t.Errorf("release notes %q (%v), want the 1.2.3 section only", notes, err)
	}
	if out, err := runErr(dist, "sha256sum", "--check", "--strict", "SHA256SUMS"); err != nil || bytes.Count(out, []byte(": OK")) != 5 {
		t.Errorf("SHA256SUMS: %v\n%s", err, out)
	}

	// What a release needs.
	for _, tc := range []struct{ version, changelog, want string }{
		{"1.2.3", changelog, "want a release tag vX.Y.Z"},
		{"v1.2", changelog, "want a release tag vX.Y.Z"},
		{"v1.2.5", changelog, `no section "## [1.2.5]"`},
	} {
		if _, out, err := release(t, tc.version, tc.changelog); err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("VERSION=%s: %v, output %q; want a failure saying %q", tc.version, err, out, tc.want)
		}
	}
}
