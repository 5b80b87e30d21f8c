package cluster

import (
	"slices"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/deviceclass"
)

func TestPeerDeviceClasses(t *testing.T) {
	tests := []struct {
		name      string
		classes   []deviceclass.DeviceClass
		wantVGs   []string
		wantPools []string
	}{{
		name: "shipped classes and an absent one",
		classes: []deviceclass.DeviceClass{
			{Name: "thick", VolumeGroup: "carve", Default: true},
			{Name: "thin", VolumeGroup: "carve", ThinPool: "pool0"},
			{Name: "absent", VolumeGroup: "carve-absent"},
		},
		wantVGs:   []string{"carve-peer-1", "carve-peer-1", "carve-absent"},
		wantPools: []string{"pool0"},
	}, {
		name: "no default class: the first class's volume group",
		classes: []deviceclass.DeviceClass{
			{Name: "a", VolumeGroup: "vg0", ThinPool: "p1"},
			{Name: "b", VolumeGroup: "vg0", ThinPool: "p1"},
			{Name: "c", VolumeGroup: "vg0", ThinPool: "p2"},
		},
		wantVGs:   []string{"carve-peer-1", "carve-peer-1", "carve-peer-1"},
		wantPools: []string{"p1", "p2"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bed := &deviceclass.Config{DeviceClasses: tt.classes}
			got, pools := peerDeviceClasses(bed, "carve-peer-1")
			var vgs []string
			for _, dc := range got.DeviceClasses {
				vgs = append(vgs, dc.VolumeGroup)
			}
			if !slices.Equal(vgs, tt.wantVGs) || !slices.Equal(pools, tt.wantPools) {
				t.Errorf("volume groups %v, pools %v; want %v, %v", vgs, pools, tt.wantVGs, tt.wantPools)
			}
			if bed.DeviceClasses[0].VolumeGroup == "carve-peer-1" {
				t.Error("the bed's own classes were changed")
			}
		})
	}
}

func TestPeerStartScriptUsesTheDaemonSetsCommand(t *testing.T) {
	m, err := LoadManifests("../../../deploy/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.AddNodeAgentArg("--node-copy-address=$(POD_IP):9811"); err != nil {
		t.Fatal(err)
	}
	ds, err := m.NodeDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	if !servesCopies(ds) {
		t.Fatal("AddNodeAgentArg did not reach the DaemonSet's carve container")
	}
	p := &GuestPeer{Name: "peer-1", PodName: "carve-node-x", IP: "10.213.0.1", ChannelPort: 19809, CopyPort: 19802, MetricsPort: 19801,
		guestDir: "/carve/peers/peer-1", state: "/var/lib/node/peers/peer-1"}
	script, err := p.startScript(ds, "/carve/peers/bin/carve-node")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"'setsid' 'env' 'NODE_NAME=peer-1' 'POD_IP=10.213.0.1'",
		"'/carve/peers/bin/carve-node' 'node'",
		"'--node-name=peer-1'",
		"'--node-channel-address=10.213.0.1:19809'",
		"'--node-copy-address=10.213.0.1:19802'",
		"'--kubelet-registration-dir='",
		"'--state-dir=/var/lib/node/peers/peer-1/state'",
		"'--node-channel-token-file=/carve/peers/peer-1/token'",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("the start script lacks %s:\n%s", want, script)
		}
	}
	if strings.Contains(script, "9811") {
		t.Errorf("the start script keeps the DaemonSet's copy port:\n%s", script)
	}
}
