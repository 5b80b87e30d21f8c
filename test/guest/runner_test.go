//go:build guesttest

package guest

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/guestvm"
)

// guestRun is one run of an inner test package in a fresh guest.
type guestRun struct {
	pkg     string   // an import path, or a path relative to this directory
	args    []string // flags for the inner test binary after -test.v and -test.timeout
	timeout time.Duration
	// withCarve also builds the carve binary and hands it to the inner
	// tests (-carve) with a directory for their artifacts (-artifacts),
	// kept in $CARVE_CACHE/guest-artifacts/<package>; the guest gets
	// 4 GiB, for the loop files and overlays of tests that run side by
	// side.
	withCarve bool
}

// runInGuest builds the inner package's test binary (and carve) on the
// host, where Go runs about 28 times faster than under TCG, runs it in a
// fresh guest with -test.v and streams its output to stdout, so that the
// inner tests' own --- PASS lines reach hack/summarize-go-test.sh. It
// fails the test unless the binary exited 0 and printed PASS, and returns
// the output.
func runInGuest(t *testing.T, r guestRun) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout+5*time.Minute)
	defer cancel()
	build := t.TempDir()
	inner := filepath.Join(build, "inner.test")
	files := []guestvm.File{{Name: "inner.test", Source: inner}}
	args := []string{guestvm.GuestPath("inner.test"), "-test.v", "-test.timeout", r.timeout.String()}
	memory := 0 // guestvm's default
	start := time.Now()
	if r.withCarve {
		carve := filepath.Join(build, "carve")
		if err := guestvm.BuildBinary(ctx, "github.com/carve-csi/carve/cmd/carve", nil, carve); err != nil {
			t.Fatal(err)
		}
		files = append(files, guestvm.File{Name: "carve", Source: carve})
		args = append(args, "-carve", guestvm.GuestPath("carve"), "-artifacts", guestvm.GuestPath("artifacts"))
		memory = 4096
	}
	if err := guestvm.BuildTestBinary(ctx, r.pkg, []string{"guestinner"}, inner); err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s (carve too: %v) in %s", r.pkg, r.withCarve, time.Since(start).Round(time.Millisecond))

	work := t.TempDir()
	var out bytes.Buffer
	stream := io.MultiWriter(os.Stdout, &out)
	res, err := guestvm.Run(ctx, guestvm.Spec{
		WorkDir:   work,
		Files:     files,
		Args:      append(args, r.args...),
		Timeout:   r.timeout + 3*time.Minute,
		MemoryMiB: memory,
		Stdout:    stream, Stderr: stream,
	})
	if r.withCarve {
		keepArtifacts(t, filepath.Join(work, "artifacts"), filepath.Base(r.pkg))
	}
	if err != nil {
		t.Fatalf("guest run of %s: %v", r.pkg, err)
	}
	t.Logf("guest run of %s: kernel %s, boot %s, whole run %s, exit %d", r.pkg, res.Kernel,
		res.BootTime.Round(time.Millisecond), res.Duration.Round(time.Second), res.ExitCode)
	text := out.String()
	summarizeInner(t, text)
	if res.ExitCode != 0 {
		t.Fatalf("the inner tests of %s failed in the guest (exit %d); their output is above", r.pkg, res.ExitCode)
	}
	if !regexp.MustCompile(`(?m)^PASS$`).MatchString(text) {
		t.Fatalf("the inner tests of %s exited 0 but did not print PASS", r.pkg)
	}
	return text
}

// summarizeInner repeats, in this test's log, the figures the inner tests
// printed: sanity counts and skips, bench ratios, soak figures.
func summarizeInner(t *testing.T, text string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "SANITY ") || strings.HasPrefix(line, "ratio ") || strings.HasPrefix(line, "BENCH ") || strings.HasPrefix(line, "SOAK ") {
			t.Log(line)
		}
	}
}

// keepArtifacts copies the inner run's logs and reports out of the test's
// temporary directory, which go test removes.
func keepArtifacts(t *testing.T, dir, name string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	dst := filepath.Join(guestvm.DefaultCacheDir(), "guest-artifacts", name)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Logf("keeping artifacts: %v", err)
		return
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil || e.IsDir() {
			continue
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			t.Logf("keeping artifacts: %v", err)
			return
		}
	}
	t.Logf("plugin logs and reports of the guest run: %s", dst)
}
