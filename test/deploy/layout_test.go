//go:build deploytest

package deploy

import (
	"slices"
	"strings"
	"testing"
)

// TestModelLinksNoRPC: the volume model, the topology key, the node's
// volume lifecycle and the kubectl plugin link neither the CSI spec nor
// gRPC: reading capabilities and answering in CSI's types is the CSI
// edge's job (internal/node/driver, internal/node/capability), so the
// lifecycle can be read, tested and reused without the wire.
func TestModelLinksNoRPC(t *testing.T) {
	forbidden := []string{"github.com/container-storage-interface/spec/lib/go/csi", "google.golang.org/grpc"}
	for _, pkg := range []string{"./internal/volume", "./internal/topology", "./internal/node/provision", "./cmd/kubectl-carve"} {
		out, err := runErr(repoRoot(t), "go", "list", "-deps", pkg)
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		for _, f := range forbidden {
			if slices.Contains(deps, f) {
				t.Errorf("%s links %s", pkg, f)
			}
		}
	}
}
