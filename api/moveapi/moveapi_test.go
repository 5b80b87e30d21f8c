package moveapi

import (
	"strings"
	"testing"
)

// TestWritesLostText: the text names the seed and the stop, and the
// span between, when the annotations hold both in order; else it says
// the seed's time is not recorded.
func TestWritesLostText(t *testing.T) {
	seed, stop := "2026-12-06T10:00:00Z", "2026-12-06T10:02:30.4Z"
	for _, tt := range []struct {
		name string
		ann  map[string]string
		want string
	}{
		{"both", map[string]string{AnnSeedTime: seed, AnnStopped: stop},
			"the writes from the seed (2026-12-06T10:00:00Z) until the workload stopped (2026-12-06T10:02:30Z), at most 2m30s, are lost"},
		{"no stop", map[string]string{AnnSeedTime: seed}, "(when the seed was made is not recorded)"},
		{"a stop before the seed", map[string]string{AnnSeedTime: stop, AnnStopped: seed}, "(when the seed was made is not recorded)"},
		{"none", nil, "the writes made after the seed are lost (when the seed was made is not recorded)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := WritesLostText(tt.ann)
			if !strings.HasSuffix(got, tt.want) {
				t.Errorf("WritesLostText = %q, want it to end with %q", got, tt.want)
			}
		})
	}
}
