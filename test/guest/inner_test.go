//go:build guesttest

package guest

import (
	"regexp"
	"testing"
	"time"
)

var topLevelPass = regexp.MustCompile(`(?m)^--- PASS: `)

// TestLVMInGuest runs the lvm package's guest tests (activation, thin
// pools, snapshots, online extension, filesystems).
func TestLVMInGuest(t *testing.T) {
	out := runInGuest(t, guestRun{pkg: "github.com/carve-csi/carve/test/guest/inner/lvminner", timeout: 10 * time.Minute})
	if n := len(topLevelPass.FindAllString(out, -1)); n == 0 {
		t.Fatalf("no inner test passed; output:\n%s", out)
	} else {
		t.Logf("%d inner tests passed", n)
	}
}
