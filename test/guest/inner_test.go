//go:build guesttest

package guest

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/guestvm"
)

// innerRun describes one run of an inner test package in a guest.
type innerRun struct {
	pkg     string   // import path of the inner package
	args    []string // test flags after -test.v
	timeout time.Duration
}

var topLevelPass = regexp.MustCompile(`(?m)^--- PASS: `)

// runInner builds the inner package's test binary on the host, runs it in a
// fresh guest with -test.v and streams its output to stdout, so that the
// inner tests' own --- PASS lines reach hack/summarize-go-test.sh. It fails
// the test unless the binary exited 0.
func runInner(t *testing.T, r innerRun) guestvm.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout+5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), filepath.Base(r.pkg)+".test")
	buildStart := time.Now()
	if err := guestvm.BuildTestBinary(ctx, r.pkg, []string{"guestinner"}, bin); err != nil {
		t.Fatal(err)
	}
	t.Logf("built %s in %s", r.pkg, time.Since(buildStart).Round(time.Millisecond))
	args := append([]string{guestvm.GuestPath("inner.test"), "-test.v", "-test.timeout", r.timeout.String()}, r.args...)
	res, err := guestvm.Run(ctx, guestvm.Spec{
		WorkDir: t.TempDir(),
		Files:   []guestvm.File{{Name: "inner.test", Source: bin}},
		Args:    args,
		Timeout: r.timeout + time.Minute,
		Stdout:  os.Stdout,
		Stderr:  os.Stderr,
	})
	if err != nil {
		t.Fatalf("guest run of %s: %v", r.pkg, err)
	}
	t.Logf("guest: kernel %s, boot %s, run %s", res.Kernel, res.BootTime.Round(time.Millisecond), res.Duration.Round(time.Millisecond))
	if res.ExitCode != 0 {
		t.Fatalf("%s exited %d in the guest; stderr:\n%s", r.pkg, res.ExitCode, res.Stderr)
	}
	return res
}

// TestLVMInGuest runs the lvm package's guest tests (activation, thin
// pools, snapshots, online extension, filesystems).
func TestLVMInGuest(t *testing.T) {
	res := runInner(t, innerRun{pkg: "github.com/carve-csi/carve/test/guest/inner/lvminner", timeout: 10 * time.Minute})
	if n := len(topLevelPass.FindAll(res.Stdout, -1)); n == 0 {
		t.Fatalf("no inner test passed; stdout:\n%s", res.Stdout)
	} else {
		t.Logf("%d inner tests passed", n)
	}
}
