package cluster

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/carve-csi/carve/pkg/config"
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
		args:     []string{"plugin", "--csi-address", "$(ADDRESS)", "--node-name=$(NODE_NAME)", "--keep=$(UNKNOWN)"},
		env:      downward,
		wantArgs: []string{"plugin", "--node-name=n1", "--keep=$(UNKNOWN)", "--csi-address=/run/n1.sock", "--kubeconfig=/kc"},
		wantEnv:  wantEnv,
	}, {
		name:    "an unsimulated downward field is refused",
		env:     []corev1.EnvVar{fieldEnv("IP", "status.podIP")},
		wantErr: "status.podIP",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &corev1.Container{Name: "c", Args: tc.args, Env: tc.env}
			args, env, err := ContainerCommand(c, PodFields{Namespace: "carve-system", Node: "n1", Pod: "carve-node-abc"}, set)
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
	shipped := &config.Config{DeviceClasses: []config.DeviceClass{
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
	ds, c, err := m.NodeDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	plugin, err := daemonSetContainer(ds, "carve plugin", isCarvePlugin)
	if err != nil {
		t.Fatal(err)
	}
	// The harness runs the carve plugin, csi-provisioner and csi-snapshotter
	// as processes; a container it does not know would silently not run.
	snap, err := daemonSetContainer(ds, "csi-snapshotter", isSnapshotter)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Name == c.Name {
		t.Errorf("NodeDaemonSet took csi-snapshotter (%s) for csi-provisioner", snap.Image)
	}
	for _, ct := range ds.Spec.Template.Spec.Containers {
		if ct.Name != plugin.Name && ct.Name != c.Name && ct.Name != snap.Name {
			t.Errorf("the node DaemonSet runs container %s, which the harness does not run", ct.Name)
		}
	}
	// No kubelet runs here: the plugin must not try to register with one.
	n := &Node{Socket: "/run/n1.sock", ConfigFile: "/etc/n1.yaml"}
	args, _, err := ContainerCommand(plugin, PodFields{Namespace: ds.Namespace, Node: "n1", Pod: "carve-node-abc"}, n.pluginFlags(9999, "/kc", nil))
	if err != nil {
		t.Fatal(err)
	}
	var regDirs []string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--kubelet-registration-dir"); ok {
			regDirs = append(regDirs, v)
		}
	}
	if !slices.Equal(regDirs, []string{"="}) {
		t.Errorf("the simulated node's plugin gets --kubelet-registration-dir%q, want it once and empty; args %q", regDirs, args)
	}
	if ds.Spec.Template.Spec.ServiceAccountName == "" {
		t.Error("the node DaemonSet names no service account; the harness authenticates csi-provisioner as it")
	}
	for _, want := range []string{"--node-deployment", "--strict-topology", "--immediate-topology=false", "--enable-capacity", "--extra-create-metadata"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("csi-provisioner args %q lack %s (DESIGN.md)", c.Args, want)
		}
	}
	d, err := m.ControllerDeployment()
	if err != nil {
		t.Fatal(err)
	}
	spec := &d.Spec.Template.Spec
	resizer, err := findContainer(spec, d.Name, "csi-resizer", isResizer)
	if err != nil {
		t.Error(err)
	} else if !slices.Contains(resizer.Args, "--leader-election") {
		t.Errorf("csi-resizer args %q lack --leader-election (one replica acts at a time)", resizer.Args)
	}
	if spec.ServiceAccountName == "" {
		t.Error("the controller Deployment names no service account; the harness authenticates csi-resizer as it")
	}
}

func TestParseManifestsRejectsObjectsWithoutKind(t *testing.T) {
	_, err := ParseManifests([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\nmetadata: {name: b}\n"), "x.yaml")
	if err == nil || !strings.Contains(err.Error(), "x.yaml") {
		t.Fatalf("error %v, want one naming x.yaml", err)
	}
}
