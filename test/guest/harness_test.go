//go:build guesttest

package guest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/guestvm"
)

// probeScript runs in the guest under the host's /bin/sh and reports what
// the harness promised: the argument as given, the environment, the
// modules and a writable /etc/lvm, separate stderr, a result file and the
// exit status.
const probeScript = `printf 'arg=[%s]\n' "$1"
printf 'env=[%s] lc=[%s] udev=[%s]\n' "$PROBE" "$LC_ALL" "$DM_DISABLE_UDEV"
printf 'config=[%s]\n' "$(cat /carve/conf/probe.conf)"
dmsetup targets | grep -q '^thin-pool' && echo 'dm=thin-pool'
test -e /dev/loop-control && echo 'loop=yes'
touch /etc/lvm/archive/probe /run/lock/lvm/probe && echo 'lvmdirs=writable'
echo 'to stderr' >&2
echo result > /carve/out.txt
exit 3
`

// TestHarness checks guestvm itself: what goes in, what comes back, and
// that a guest that cannot start in time is killed with a clear error.
func TestHarness(t *testing.T) {
	t.Run("run", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		work := t.TempDir()
		arg := `it's "quoted" $HOME`
		var stream bytes.Buffer
		res, err := guestvm.Run(ctx, guestvm.Spec{
			WorkDir: work,
			Files: []guestvm.File{
				{Name: "probe.sh", Data: []byte(probeScript)},
				{Name: "conf/probe.conf", Data: []byte("cfg")},
			},
			Args:   []string{"/bin/sh", guestvm.GuestPath("probe.sh"), arg},
			Env:    []string{"PROBE=v a'l"},
			Stdout: &stream,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kernel %s boot %s total %s", res.Kernel, res.BootTime.Round(time.Millisecond), res.Duration.Round(time.Millisecond))
		out := string(res.Stdout)
		for _, want := range []string{
			"arg=[" + arg + "]",
			"env=[v a'l] lc=[C] udev=[1]",
			"config=[cfg]",
			"dm=thin-pool",
			"loop=yes",
			"lvmdirs=writable",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("stdout lacks %q:\n%s", want, out)
			}
		}
		if res.ExitCode != 3 {
			t.Errorf("exit code %d, want 3", res.ExitCode)
		}
		if string(res.Stderr) != "to stderr\n" {
			t.Errorf("stderr %q, want %q", res.Stderr, "to stderr\n")
		}
		if stream.String() != out {
			t.Errorf("streamed stdout %q differs from the returned %q", stream.String(), out)
		}
		if b, err := os.ReadFile(filepath.Join(work, "out.txt")); err != nil || string(b) != "result\n" {
			t.Errorf("result file: %q, %v", b, err)
		}
		if res.BootTime <= 0 || res.BootTime > res.Duration {
			t.Errorf("boot time %s, total %s", res.BootTime, res.Duration)
		}
	})
	t.Run("forward to a host loopback port", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.WriteString(w, "hello from the host "+r.URL.Path); err != nil {
				t.Errorf("answering %s: %v", r.URL.Path, err)
			}
		}))
		defer srv.Close()
		res, err := guestvm.Run(ctx, guestvm.Spec{
			WorkDir:  t.TempDir(),
			Args:     []string{"busybox", "wget", "-q", "-O", "-", "http://" + guestvm.GuestForwardIP + ":8080/probe"},
			Forwards: []guestvm.Forward{{GuestPort: 8080, HostAddr: srv.Listener.Addr().String()}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || string(res.Stdout) != "hello from the host /probe" {
			t.Fatalf("wget in the guest: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("boot timeout", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		_, err := guestvm.Run(ctx, guestvm.Spec{
			WorkDir:     t.TempDir(),
			Args:        []string{"/bin/true"},
			BootTimeout: 500 * time.Millisecond,
		})
		if err == nil || !strings.Contains(err.Error(), "did not start the command within") {
			t.Fatalf("Run with a 500ms boot timeout = %v, want a boot timeout error", err)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("qemu was not stopped promptly: Run took %s", d)
		}
	})
}
