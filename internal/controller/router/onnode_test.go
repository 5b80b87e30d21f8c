package router

import (
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/topology"
)

// TestOnNode: a move's calls about a volume go to the node it names and
// to no other (node-c claims the handle too and is never asked); a node
// not in the pool is UNAVAILABLE, never "deleted" or NOT_FOUND.
func TestOnNode(t *testing.T) {
	dst := vid("target")
	for _, tt := range []struct {
		name, node string
		pvs        map[string][]string
		code       codes.Code
		msg        []string
		calls      []string
	}{
		{name: "sent to its node", node: "node-b", calls: []string{"node-b ControllerGetVolume " + dst, "node-b DeleteVolume " + dst}},
		{name: "its node not in the pool", node: "node-x", code: codes.Unavailable, msg: []string{"node node-x is unreachable"}},
		{name: "no node", node: "", code: codes.InvalidArgument, msg: []string{"node: must be set"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns, log := cluster(t, &agent{name: "node-b", volumes: []string{dst}}, &agent{name: "node-c", volumes: []string{dst}})
			s := New(Config{Nodes: ns, Volumes: locator{pvs: tt.pvs}, TopologyKey: topology.Key})
			_, gerr := s.ControllerGetVolumeOn(t.Context(), tt.node, &csi.ControllerGetVolumeRequest{VolumeId: dst})
			_, derr := s.DeleteVolumeOn(t.Context(), tt.node, &csi.DeleteVolumeRequest{VolumeId: dst})
			if tt.code != codes.OK {
				wantStatus(t, gerr, tt.code, tt.msg...)
				wantStatus(t, derr, tt.code, tt.msg...)
			} else if gerr != nil || derr != nil {
				t.Fatalf("ControllerGetVolumeOn: %v; DeleteVolumeOn: %v", gerr, derr)
			}
			if got := log.all(); !slices.Equal(got, tt.calls) {
				t.Errorf("calls %q, want %q", got, tt.calls)
			}
		})
	}
	t.Run("a volume a PV pins to the node", func(t *testing.T) {
		ns, log := cluster(t, &agent{name: "node-b", volumes: []string{dst}})
		s := New(Config{Nodes: ns, Volumes: locator{pvs: map[string][]string{dst: {"node-b"}}}, TopologyKey: topology.Key})
		_, err := s.DeleteVolumeOn(t.Context(), "node-b", &csi.DeleteVolumeRequest{VolumeId: dst})
		wantStatus(t, err, codes.FailedPrecondition, "a PersistentVolume names it")
		if got := log.all(); len(got) != 0 {
			t.Errorf("calls %q, want none", got)
		}
	})
}
