package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/carve-csi/carve/internal/node/deviceclass"
)

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

func TestContainerCommand(t *testing.T) {
	downward := []corev1.EnvVar{
		fieldEnv("NODE_NAME", "spec.nodeName"),
		fieldEnv("NAMESPACE", "metadata.namespace"),
		fieldEnv("POD_NAME", "metadata.name"),
		{Name: "ADDRESS", Value: "/csi/csi.sock"},
	}
	wantEnv := []string{"NODE_NAME=n1", "NAMESPACE=carve-system", "POD_NAME=carve-node-abc", "ADDRESS=/csi/csi.sock"}
	set := []FlagValue{{"csi-address", "/run/n1.sock"}, {"kubeconfig", "/kc"}}
	tests := []struct {
		name     string
		args     []string
		env      []corev1.EnvVar
		wantArgs []string
		wantEnv  []string
		wantErr  string
	}{{
		name:     "shipped flags kept, the harness's flags replaced and appended",
		args:     []string{"--csi-address=/csi/csi.sock", "--node-deployment", "--capacity-ownerref-level=0"},
		env:      downward,
		wantArgs: []string{"--node-deployment", "--capacity-ownerref-level=0", "--csi-address=/run/n1.sock", "--kubeconfig=/kc"},
		wantEnv:  wantEnv,
	}, {
		name:     "$(VAR) expanded, a separate flag value skipped, positional args kept",
		args:     []string{"node", "--csi-address", "$(ADDRESS)", "--node-name=$(NODE_NAME)", "--keep=$(UNKNOWN)"},
		env:      downward,
		wantArgs: []string{"node", "--node-name=n1", "--keep=$(UNKNOWN)", "--csi-address=/run/n1.sock", "--kubeconfig=/kc"},
		wantEnv:  wantEnv,
	}, {
		name:     "the pod's IP filled in",
		args:     []string{"node", "--node-channel-address=$(POD_IP):9809"},
		env:      []corev1.EnvVar{fieldEnv("POD_IP", "status.podIP")},
		wantArgs: []string{"node", "--node-channel-address=192.0.2.7:9809", "--csi-address=/run/n1.sock", "--kubeconfig=/kc"},
		wantEnv:  []string{"POD_IP=192.0.2.7"},
	}, {
		name:    "an unsimulated downward field is refused",
		env:     []corev1.EnvVar{fieldEnv("HOST_IP", "status.hostIP")},
		wantErr: "status.hostIP",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &corev1.Container{Name: "c", Args: tc.args, Env: tc.env}
			args, env, err := ContainerCommand(c, PodFields{Namespace: "carve-system", Node: "n1", Pod: "carve-node-abc", IP: "192.0.2.7"}, set)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(args, tc.wantArgs) {
				t.Errorf("args\n got %q\nwant %q", args, tc.wantArgs)
			}
			if !slices.Equal(env, tc.wantEnv) {
				t.Errorf("env\n got %q\nwant %q", env, tc.wantEnv)
			}
		})
	}
}

func TestNodeConfigPointsClassesAtTheNodesVG(t *testing.T) {
	spare := resource.MustParse("1Gi")
	shipped := &deviceclass.Config{DeviceClasses: []deviceclass.DeviceClass{
		{Name: "thick", VolumeGroup: "carve", Default: true, Spare: &spare},
		{Name: "thin", VolumeGroup: "carve", ThinPool: "pool0", OverprovisionRatio: 4},
	}}
	got := nodeConfig(shipped, "vg-n1")
	if len(got.DeviceClasses) != 1 {
		t.Fatalf("classes %+v, want the thick class only (no thin pool without device-mapper)", got.DeviceClasses)
	}
	c := got.DeviceClasses[0]
	if c.Name != "thick" || c.VolumeGroup != "vg-n1" || !c.Default || c.Spare.Cmp(spare) != 0 {
		t.Errorf("class %+v, want thick on vg-n1, default, spare 1Gi", c)
	}
	if shipped.DeviceClasses[0].VolumeGroup != "carve" {
		t.Errorf("the shipped config was modified: %+v", shipped.DeviceClasses[0])
	}
}

func TestShippedManifestsParse(t *testing.T) {
	m, err := LoadManifests("../../../deploy/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Objects[0].GetKind(); got != "Namespace" {
		t.Errorf("first object %s, want the Namespace (applied before what lives in it)", got)
	}
	ds, err := m.NodeDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	plugin, err := daemonSetContainer(ds, "carve node", isCarvePlugin)
	if err != nil {
		t.Fatal(err)
	}
	// The harness runs the node agent alone on each node, and every
	// container of the controller Deployment: a container it does not know
	// would silently not run.
	if err := checkNodeContainers(ds); err != nil {
		t.Error(err)
	}
	// No kubelet runs here: the plugin must not try to register with one,
	// and its node channel listens where the harness says.
	n := &Node{Socket: "/run/n1.sock", ConfigFile: "/etc/n1.yaml", ChannelAddr: "192.0.2.7:40000",
		ChannelCAFile: "/run/n1/ca.crt", ChannelTokenFile: "/run/n1/token"}
	args, _, err := ContainerCommand(plugin, PodFields{Namespace: ds.Namespace, Node: "n1", Pod: "carve-node-abc", IP: "192.0.2.7"}, n.pluginFlags(9999, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ flag, want string }{
		{"kubelet-registration-dir", ""}, {"node-channel-address", n.ChannelAddr},
		{"state-dir", "/run/state"}, {"allow-volatile-state-dir", "true"},
		// The node agent has no API access: no kubeconfig, and no flag
		// of the audit that moved to the controller.
		{"node-channel-ca-file", n.ChannelCAFile}, {"node-channel-token-file", n.ChannelTokenFile},
	} {
		var got []string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+f.flag+"="); ok {
				got = append(got, v)
			}
		}
		if !slices.Equal(got, []string{f.want}) {
			t.Errorf("the simulated node's plugin gets --%s %q, want it once as %q; args %q", f.flag, got, f.want, args)
		}
	}
	for _, want := range []string{"node-channel-address", "node-channel-ca-file", "node-channel-token-file"} {
		if _, ok := flagValue(plugin.Args, want); !ok {
			t.Errorf("the DaemonSet's carve node args %q lack --%s (the node channel)", plugin.Args, want)
		}
	}
	if ds.Spec.Template.Spec.ServiceAccountName == "" {
		t.Error("the node DaemonSet names no service account; the harness binds the agents' tokens to it")
	}
	// Each simulated node runs what the DaemonSet runs: carve-node, beside
	// the carve binary; the controller runs the image's entrypoint, carve.
	bin := fakeBinaries(t, "carve", "carve-node")
	if got, err := containerProgram(filepath.Join(bin, "carve"), plugin); err != nil || got != filepath.Join(bin, "carve-node") {
		t.Errorf("the harness runs %q (%v) for the DaemonSet's %v plugin, want %s", got, err, plugin.Command, filepath.Join(bin, "carve-node"))
	}
	d, err := m.ControllerDeployment()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkControllerContainers(d); err != nil {
		t.Error(err)
	}
	spec := &d.Spec.Template.Spec
	carve, err := findContainer(spec, d.Name, "carve controller", isCarveController)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := containerProgram(filepath.Join(bin, "carve"), carve); err != nil || got != filepath.Join(bin, "carve") {
		t.Errorf("the harness runs %q (%v) for the Deployment's carve controller, want %s", got, err, filepath.Join(bin, "carve"))
	}
	if _, err := nodeChannelOf(carve, d.Namespace, ds); err != nil && !strings.Contains(err.Error(), "IPv4") {
		t.Error(err)
	}
	if prov, err := findContainer(spec, d.Name, "csi-provisioner", isProvisioner); err == nil {
		for _, want := range []string{"--strict-topology", "--immediate-topology=false", "--extra-create-metadata", "--leader-election"} {
			if !slices.Contains(prov.Args, want) {
				t.Errorf("csi-provisioner args %q lack %s (DESIGN.md)", prov.Args, want)
			}
		}
		for _, not := range []string{"node-deployment", "enable-capacity"} {
			if _, ok := flagValue(prov.Args, not); ok {
				t.Errorf("csi-provisioner args %q hold --%s: the controller routes calls and writes capacity", prov.Args, not)
			}
		}
	}
	resizer, err := findContainer(spec, d.Name, "csi-resizer", isResizer)
	if err != nil {
		t.Error(err)
	} else if !slices.Contains(resizer.Args, "--leader-election") {
		t.Errorf("csi-resizer args %q lack --leader-election (one replica acts at a time)", resizer.Args)
	}
	if spec.ServiceAccountName == "" {
		t.Error("the controller Deployment names no service account; the harness authenticates its processes as it")
	}
}

func TestFlagValue(t *testing.T) {
	args := []string{"controller", "--node-channel-service=carve-node", "--node-channel-ca", "ca", "--flag", "--empty="}
	tests := []struct {
		name, want string
		found      bool
	}{
		{"node-channel-service", "carve-node", true},
		{"node-channel-ca", "ca", true},
		{"flag", "", true},
		{"empty", "", true},
		{"absent", "", false},
	}
	for _, tc := range tests {
		got, found := flagValue(args, tc.name)
		if got != tc.want || found != tc.found {
			t.Errorf("flagValue(%q) = %q, %v; want %q, %v", tc.name, got, found, tc.want, tc.found)
		}
	}
}

func TestParseManifestsRejectsObjectsWithoutKind(t *testing.T) {
	_, err := ParseManifests([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\nmetadata: {name: b}\n"), "x.yaml")
	if err == nil || !strings.Contains(err.Error(), "x.yaml") {
		t.Fatalf("error %v, want one naming x.yaml", err)
	}
}

// fakeBinaries makes a directory with an empty executable of each name.
func fakeBinaries(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestContainerProgram: the harness runs, for a container of carve's
// image, the make build binary its command names, beside bin/carve.
func TestContainerProgram(t *testing.T) {
	bin := fakeBinaries(t, "carve", "carve-node")
	carve := filepath.Join(bin, "carve")
	for _, tc := range []struct {
		name    string
		command []string
		want    string // "" means an error
	}{
		{"the entrypoint", nil, carve},
		{"carve by its path", []string{"/usr/local/bin/carve"}, carve},
		{"carve-node", []string{"/usr/local/bin/carve-node"}, filepath.Join(bin, "carve-node")},
		{"carve-node under tini", []string{"/usr/bin/tini", "--", "/usr/local/bin/carve-node"}, filepath.Join(bin, "carve-node")},
		{"a program make build does not build", []string{"/usr/local/bin/carve-other"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := containerProgram(carve, &corev1.Container{Name: "carve", Command: tc.command})
			switch {
			case tc.want == "" && (err == nil || !strings.Contains(err.Error(), "make build")):
				t.Errorf("containerProgram = %q, %v; want an error that says make build", got, err)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Errorf("containerProgram = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
