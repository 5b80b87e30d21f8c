package router

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/topology"
	"github.com/carve-csi/carve/internal/volume"
)

// moves is a fake Moves: the claims held, "namespace/name".
type moves map[string]bool

func (m moves) MoveOf(ns, name string) (string, bool) {
	if m[ns+"/"+name] {
		return "claim " + ns + "/" + name + " is being moved to node node-b", true
	}
	return "", false
}

func TestCreateVolumeOfAClaimBeingMoved(t *testing.T) {
	tests := []struct {
		name   string
		params map[string]string
		moves  Moves
		code   codes.Code
	}{
		{name: "a claim being moved: refused, nothing sent", code: codes.ResourceExhausted,
			params: map[string]string{volume.ParamPVCNamespace: "app", volume.ParamPVCName: "data"}, moves: moves{"app/data": true}},
		{name: "another claim", params: map[string]string{volume.ParamPVCNamespace: "app", volume.ParamPVCName: "other"}, moves: moves{"app/data": true}},
		{name: "no claim named (no --extra-create-metadata)", moves: moves{"app/data": true}},
		{name: "no guard", params: map[string]string{volume.ParamPVCNamespace: "app", volume.ParamPVCName: "data"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns, log := cluster(t, &agent{name: "node-a"})
			s := New(Config{Nodes: ns, Volumes: locator{}, TopologyKey: topology.Key, Moves: tc.moves})
			_, err := s.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-1", Parameters: tc.params,
				VolumeCapabilities:        []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}},
				AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{topology.Key: "node-a"}}}}})
			if tc.code != codes.OK {
				wantStatus(t, err, tc.code, "being moved to node node-b", "nothing was created")
				if got := log.of("CreateVolume"); len(got) != 0 {
					t.Errorf("sent to the node: %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
