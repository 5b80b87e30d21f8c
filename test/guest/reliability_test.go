//go:build guesttest

package guest

import (
	"testing"
	"time"
)

// TestPluginNodeReliability runs the node tests of what production disks
// and hosts do to a plugin: a reboot without LVM autoactivation (every LV
// inactive, a thin pool and a thin snapshot with the activation-skip flag
// among them); a new raw-block volume on a deleted one's extents reads
// zeros; an LV left half-made by a crash is never handed out as it was.
func TestPluginNodeReliability(t *testing.T) {
	runPluginInner(t, pluginInner{
		pkg:     "./inner/nodeinner",
		run:     "^(TestStageActivatesInactiveVolumes|TestNoVolumeShowsAnotherVolumesData)$",
		timeout: 15 * time.Minute,
	})
}
