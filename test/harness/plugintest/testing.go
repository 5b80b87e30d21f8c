package plugintest

import (
	"testing"
)

// MustDevicePath is DevicePath for a test: a volume ID that names no
// device fails t.
func MustDevicePath(t testing.TB, volumeID string) string {
	t.Helper()
	dev, err := DevicePath(volumeID)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}
