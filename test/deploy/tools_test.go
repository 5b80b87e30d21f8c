//go:build deploytest

package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
)

// namespace is the namespace the kustomize base installs into; the chart is
// rendered into the same one for comparison.
const namespace = "carve-system"

// kubeVersion is what `helm template` pretends the cluster runs: a helm
// built with `go install` has no default of its own that satisfies the
// chart's kubeVersion constraint.
const kubeVersion = "v1.34.0"

// repoRoot is the repository's top directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// readRepoFile is the file at path (its elements below the repository's
// top directory); a file it cannot read fails t.
func readRepoFile(t testing.TB, path ...string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(append([]string{repoRoot(t)}, path...)...))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// tool returns the path of a tool that make test-deploy installs into
// $CARVE_CACHE/bin, failing the test with what to do when it is missing.
func tool(t testing.TB, name string) string {
	t.Helper()
	cache := os.Getenv("CARVE_CACHE")
	if cache == "" {
		t.Fatalf("CARVE_CACHE is not set: run `make test-deploy`, which installs %s into $CARVE_CACHE/bin", name)
	}
	p := filepath.Join(cache, "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing (%v): run `make test-deploy`, which installs it from the Go module proxy", name, err)
	}
	return p
}

// run runs argv without a shell, bounded by a minute, and returns stdout.
func run(t testing.TB, dir string, argv ...string) []byte {
	t.Helper()
	out, err := runErr(dir, argv...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func runErr(dir string, argv ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// object is one rendered Kubernetes object, as generic JSON-like data.
type object map[string]any

func (o object) kind() string { s, _ := o["kind"].(string); return s }

func (o object) meta(field string) string {
	m, _ := o["metadata"].(map[string]any)
	s, _ := m[field].(string)
	return s
}

// key names an object uniquely within a rendering.
func (o object) key() string {
	return fmt.Sprintf("%s %s/%s", o.kind(), o.meta("namespace"), o.meta("name"))
}

// decodeObjects splits a multi-document YAML stream into objects, skipping
// empty documents.
func decodeObjects(t testing.TB, data []byte) []object {
	t.Helper()
	dec := k8syaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []object
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("decoding rendered YAML: %v", err)
		}
		if len(o) == 0 {
			continue
		}
		objs = append(objs, o)
	}
	return objs
}

// byKey indexes objects by key, failing on duplicates.
func byKey(t testing.TB, objs []object) map[string]object {
	t.Helper()
	m := make(map[string]object, len(objs))
	for _, o := range objs {
		if _, dup := m[o.key()]; dup {
			t.Errorf("%s is rendered twice", o.key())
		}
		m[o.key()] = o
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// renderKustomize builds the kustomize base.
func renderKustomize(t testing.TB) []object {
	t.Helper()
	root := repoRoot(t)
	return decodeObjects(t, run(t, root, tool(t, "kustomize"), "build", filepath.Join(root, "deploy", "kubernetes")))
}

// renderChart renders the Helm chart with extra `--set` values; an
// argument that starts with "--" is passed as it is (e.g. --api-versions).
func renderChart(t testing.TB, set ...string) []object {
	t.Helper()
	root := repoRoot(t)
	// --skip-tests: the helm test hook's claim and pod are not part of
	// the install (nor of the kustomize base).
	argv := []string{tool(t, "helm"), "template", "carve", filepath.Join(root, "deploy", "helm", "carve"),
		"--namespace", namespace, "--kube-version", kubeVersion, "--skip-tests"}
	for _, s := range set {
		if strings.HasPrefix(s, "--") {
			argv = append(argv, s)
			continue
		}
		argv = append(argv, "--set", s)
	}
	return decodeObjects(t, run(t, root, argv...))
}
