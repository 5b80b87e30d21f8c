//go:build guesttest

package guest

import (
	"testing"
	"time"
)

// TestPluginNodeReliability runs the node tests of what production disks
// and hosts do to a plugin: a reboot without LVM autoactivation (every LV
// inactive, a thin pool and a thin snapshot with the activation-skip flag
// among them).
func TestPluginNodeReliability(t *testing.T) {
	runPluginInner(t, pluginInner{
		pkg:     "./inner/nodeinner",
		run:     "^TestStageActivatesInactiveVolumes$",
		timeout: 15 * time.Minute,
	})
}
