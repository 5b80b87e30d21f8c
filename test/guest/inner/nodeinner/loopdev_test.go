//go:build guestinner

package nodeinner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carve-csi/carve/test/harness/plugintest"
)

// attachLoop attaches file as a loop device and returns the device; it is
// detached when the test ends.
func attachLoop(ctx context.Context, t *testing.T, file string) string {
	t.Helper()
	dev, err := plugintest.Run(ctx, "losetup", "--find", "--show", file)
	if err != nil {
		t.Fatal(err)
	}
	dev = strings.TrimSpace(dev)
	t.Cleanup(func() {
		if _, err := plugintest.Run(context.Background(), "losetup", "--detach", dev); err != nil {
			t.Errorf("detaching %s: %v", dev, err)
		}
	})
	return dev
}

// writeOnePVConfig writes cfg/lvm.conf as lvmtest's, with dev as the only
// device LVM scans and activation on.
func writeOnePVConfig(t *testing.T, cfg, dev string) {
	t.Helper()
	if err := os.MkdirAll(cfg, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`devices {
	global_filter = [ "a|^%s$|", "r|.*|" ]
	use_devicesfile = 0
	obtain_device_list_from_udev = 0
	hints = "none"
	scan_lvs = 0
}
activation {
	udev_sync = 0
	udev_rules = 0
	monitoring = 0
}
`, dev)
	if err := os.WriteFile(filepath.Join(cfg, "lvm.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}
