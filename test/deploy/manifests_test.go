//go:build deploytest

package deploy

import (
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/carve-csi/carve/internal/node/deviceclass"
)

// The sidecar images carve is tested with (the releases the e2e tier
// builds); bump them here, in the chart's values (then `make manifests`)
// and in docs/install.md together.
// nodeAgentProgram is what the node DaemonSets run from carve's image:
// carve-node, cmd/carve built with -tags nodeagent (the Dockerfile).
const nodeAgentProgram = "/usr/local/bin/carve-node"

// nodeAgentCommand is the node agent's command: carve-node under tini,
// which reaps what lvm's daemons leave to PID 1.
var nodeAgentCommand = []string{"/usr/bin/tini", "--", nodeAgentProgram}

var pinnedImages = map[string]string{
	"carve":           "ghcr.io/carve-csi/carve:v0.1.0",
	"csi-provisioner": "registry.k8s.io/sig-storage/csi-provisioner:v6.4.0",
	"csi-resizer":     "registry.k8s.io/sig-storage/csi-resizer:v2.3.0",
	"csi-snapshotter": "registry.k8s.io/sig-storage/csi-snapshotter:v8.7.0",
}

// provisionerFlags are csi-provisioner's flags in the controller
// Deployment, as carve's design fixes them: central mode (no
// --node-deployment), only the selected node's topology (--strict-topology),
// no capacity tracking (carve controller writes the CSIStorageCapacity
// objects). The end-to-end harness runs csi-provisioner with whatever the
// Deployment says, so this list is also what it tests.
var provisionerFlags = []string{
	"--csi-address=/csi/csi.sock",
	"--strict-topology",
	"--immediate-topology=false",
	"--extra-create-metadata",
	"--leader-election",
	"--leader-election-lease-duration=10s",
	"--leader-election-renew-deadline=6s",
	"--leader-election-retry-period=2s",
	"--leader-election-namespace=$(NAMESPACE)",
	"--http-endpoint=:9811",
	"--kube-api-qps=50",
	"--kube-api-burst=100",
}

// snapshotterFlags are csi-snapshotter's flags in the controller
// Deployment: one leader acts for every node; carve has no volume group
// snapshots.
var snapshotterFlags = []string{
	"--csi-address=/csi/csi.sock",
	"--leader-election",
	"--leader-election-lease-duration=10s",
	"--leader-election-renew-deadline=6s",
	"--leader-election-retry-period=2s",
	"--leader-election-namespace=$(NAMESPACE)",
	"--feature-gates=CSIVolumeGroupSnapshot=false",
	"--http-endpoint=:9813",
}

// snapshotClassFields are the top-level fields of a VolumeSnapshotClass
// (snapshot.storage.k8s.io/v1), whose Go type is not in client-go's
// scheme; the e2e tier applies it to an apiserver with the CRD's schema.
var snapshotClassFields = []string{"apiVersion", "kind", "metadata", "driver", "deletionPolicy", "parameters"}

// typed decodes o strictly into its Go type from client-go's scheme: an
// unknown or misspelled field, a wrong type or an unknown kind fails. A
// VolumeSnapshotClass is checked field by field and returned as
// unstructured.
func typed(t *testing.T, o object) runtime.Object {
	t.Helper()
	if o.kind() == "VolumeSnapshotClass" {
		for k := range o {
			if !slices.Contains(snapshotClassFields, k) {
				t.Fatalf("%s has field %q, which a VolumeSnapshotClass has not", o.key(), k)
			}
		}
		if o["apiVersion"] != "snapshot.storage.k8s.io/v1" {
			t.Fatalf("%s: apiVersion %v", o.key(), o["apiVersion"])
		}
		if p, ok := o["deletionPolicy"]; !ok || (p != "Delete" && p != "Retain") {
			t.Fatalf("%s: deletionPolicy %v, want Delete or Retain", o.key(), p)
		}
		return &unstructured.Unstructured{Object: o}
	}
	data, err := json.Marshal(o)
	if err != nil {
		t.Fatalf("%s: %v", o.key(), err)
	}
	s := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, kjson.SerializerOptions{Strict: true})
	obj, _, err := s.Decode(data, nil, nil)
	if err != nil {
		t.Fatalf("%s is not a valid object: %v", o.key(), err)
	}
	return obj
}

// baseObjects renders the kustomize base and decodes every object.
func baseObjects(t *testing.T) map[string]runtime.Object {
	t.Helper()
	out := map[string]runtime.Object{}
	for _, o := range renderKustomize(t) {
		out[o.key()] = typed(t, o)
	}
	return out
}

func get[T runtime.Object](t *testing.T, objs map[string]runtime.Object, key string) T {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		t.Fatalf("the base renders no %s; it renders %v", key, sortedKeys(objs))
	}
	v, ok := o.(T)
	if !ok {
		t.Fatalf("%s decoded to %T", key, o)
	}
	return v
}

func TestBaseRendersExpectedObjects(t *testing.T) {
	objs := baseObjects(t)
	want := []string{
		"CSIDriver /lvm.carve.dev",
		"ClusterRole /carve-controller-audit",
		"ClusterRole /carve-controller-lost-nodes",
		"ClusterRole /carve-controller-mover",
		"ClusterRole /carve-controller-node-channel",
		"ClusterRole /carve-controller-placement",
		"ClusterRole /carve-controller-provisioner",
		"ClusterRole /carve-controller-resizer",
		"ClusterRole /carve-controller-snapshotter",
		"ClusterRoleBinding /carve-controller-audit",
		"ClusterRoleBinding /carve-controller-lost-nodes",
		"ClusterRoleBinding /carve-controller-mover",
		"ClusterRoleBinding /carve-controller-node-channel",
		"ClusterRoleBinding /carve-controller-placement",
		"ClusterRoleBinding /carve-controller-provisioner",
		"ClusterRoleBinding /carve-controller-resizer",
		"ClusterRoleBinding /carve-controller-snapshotter",
		"ConfigMap carve-system/carve-device-classes",
		"DaemonSet carve-system/carve-node",
		"Deployment carve-system/carve-controller",
		"Namespace /carve-system",
		"PodDisruptionBudget carve-system/carve-controller",
		"Role carve-system/carve-controller-leader-election",
		"Role carve-system/carve-controller-node-channel",
		"RoleBinding carve-system/carve-controller-leader-election",
		"RoleBinding carve-system/carve-controller-node-channel",
		"Service carve-system/carve-controller-metrics",
		"Service carve-system/carve-node",
		"Service carve-system/carve-node-metrics",
		"Service carve-system/carve-provisioner-metrics",
		"Service carve-system/carve-resizer-metrics",
		"Service carve-system/carve-snapshotter-metrics",
		"ServiceAccount carve-system/carve-controller",
		"ServiceAccount carve-system/carve-node",
		"StorageClass /carve-thick-ext4",
		"StorageClass /carve-thin-xfs",
	}
	if got := sortedKeys(objs); !reflect.DeepEqual(got, want) {
		t.Errorf("rendered objects:\n got %q\nwant %q", got, want)
	}
	t.Logf("the base renders %d objects", len(objs))
}

func TestCSIDriver(t *testing.T) {
	d := get[*storagev1.CSIDriver](t, baseObjects(t), "CSIDriver /lvm.carve.dev")
	checks := []struct {
		name string
		ok   bool
	}{
		{"attachRequired false", d.Spec.AttachRequired != nil && !*d.Spec.AttachRequired},
		{"podInfoOnMount true", d.Spec.PodInfoOnMount != nil && *d.Spec.PodInfoOnMount},
		{"storageCapacity true", d.Spec.StorageCapacity != nil && *d.Spec.StorageCapacity},
		{"fsGroupPolicy File", d.Spec.FSGroupPolicy != nil && *d.Spec.FSGroupPolicy == storagev1.FileFSGroupPolicy},
		{"volumeLifecycleModes [Persistent]", reflect.DeepEqual(d.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent})},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("CSIDriver: want %s, spec is %+v", c.name, d.Spec)
		}
	}
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// flagValue returns the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func TestNodeDaemonSet(t *testing.T) {
	objs := baseObjects(t)
	ds := get[*appsv1.DaemonSet](t, objs, "DaemonSet carve-system/carve-node")
	spec := ds.Spec.Template.Spec

	// The node agent alone: csi-provisioner and csi-snapshotter run in the
	// controller Deployment; carve registers itself and serves its own
	// probes (no node-driver-registrar, no livenessprobe).
	var names []string
	for _, c := range spec.Containers {
		names = append(names, c.Name)
	}
	if want := []string{"carve"}; !reflect.DeepEqual(names, want) {
		t.Errorf("containers %v, want %v", names, want)
	}
	if spec.ServiceAccountName != "carve-node" {
		t.Errorf("serviceAccountName %q, want carve-node", spec.ServiceAccountName)
	}
	// The node agent holds no API rights and gets no API token; its
	// service account only names the pod in the projected token for carve
	// controller.
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken is not false; the node agent must get no API token")
	}
	checkNodeSelection(t, ds)
	for _, c := range spec.Containers {
		if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
			t.Errorf("container %s: terminationMessagePolicy %q, want FallbackToLogsOnError", c.Name, c.TerminationMessagePolicy)
		}
	}

	hostPaths := map[string]string{}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	plugin := container(t, spec, "carve")
	if plugin.SecurityContext == nil || plugin.SecurityContext.Privileged == nil || !*plugin.SecurityContext.Privileged {
		t.Error("the carve node container is not privileged")
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range plugin.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for _, tc := range []struct {
		mountPath, hostPath string
		propagation         corev1.MountPropagationMode
	}{
		{"/var/lib/kubelet", "/var/lib/kubelet", corev1.MountPropagationBidirectional},
		{"/dev", "/dev", ""},
		{"/etc/lvm", "/etc/lvm", ""},
		{"/run/lock/lvm", "/run/lock/lvm", ""},
		{"/csi", "/var/lib/kubelet/plugins/lvm.carve.dev", ""},
		{"/registration", "/var/lib/kubelet/plugins_registry", ""},
		{"/var/lib/carve", "/var/lib/carve", ""},
		{"/host/sys/fs/cgroup", "/sys/fs/cgroup", ""},
	} {
		m, ok := mounts[tc.mountPath]
		if !ok {
			t.Errorf("the plugin does not mount %s", tc.mountPath)
			continue
		}
		if hostPaths[m.Name] != tc.hostPath {
			t.Errorf("the plugin's %s is host path %q, want %q", tc.mountPath, hostPaths[m.Name], tc.hostPath)
		}
		got := corev1.MountPropagationMode("")
		if m.MountPropagation != nil {
			got = *m.MountPropagation
		}
		if tc.propagation != "" && got != tc.propagation {
			t.Errorf("the plugin's %s has propagation %q, want %q", tc.mountPath, got, tc.propagation)
		}
	}

	// The plugin's command line: role, socket, node name, config file on
	// the ConfigMap's mount, metrics on the port the Service targets, and
	// the node channel on the pod's own address with the CA and the token
	// where the pod mounts them.
	if len(plugin.Args) == 0 || plugin.Args[0] != "node" {
		t.Errorf("plugin args %v do not start with the node role", plugin.Args)
	}
	// carve-node: the node agent's binary, which links no Kubernetes
	// client (the image's carve has the controller role too).
	if !reflect.DeepEqual(plugin.Command, nodeAgentCommand) {
		t.Errorf("the plugin's command is %v, want %v", plugin.Command, nodeAgentCommand)
	}
	for flag, want := range map[string]string{
		"--endpoint":                "unix:///csi/csi.sock",
		"--node-name":               "$(NODE_NAME)",
		"--config":                  "/etc/carve/config.yaml",
		"--node-channel-address":    "$(POD_IP):9809",
		"--node-channel-ca-file":    "/etc/carve/node-channel/ca.crt",
		"--node-channel-token-file": "/var/run/secrets/carve.dev/token",
		"--state-dir":               "/var/lib/carve",
	} {
		if got, _ := flagValue(plugin.Args, flag); got != want {
			t.Errorf("plugin %s=%q, want %q", flag, got, want)
		}
	}
	// /etc/carve: the device-class file and the CA bundle, which carve
	// controller publishes (optional: the pod starts before it exists).
	if cm, ca := nodeConfigVolume(t, spec); cm != "carve-device-classes" || !ca {
		t.Errorf("/etc/carve holds ConfigMap %q and the CA bundle %v; want carve-device-classes and node-channel/ca.crt of the optional ConfigMap carve-node-channel-ca", cm, ca)
	}
	// The projected token the controller reviews at enrollment: audience
	// carve-controller, an hour's life, read-only.
	if m, ok := mounts["/var/run/secrets/carve.dev"]; !ok || !m.ReadOnly {
		t.Error("the plugin does not mount /var/run/secrets/carve.dev read-only")
	} else if v := volumes[m.Name]; v.Projected == nil || len(v.Projected.Sources) != 1 || v.Projected.Sources[0].ServiceAccountToken == nil {
		t.Errorf("/var/run/secrets/carve.dev is %+v, want one projected service-account token", v.VolumeSource)
	} else if tok := v.Projected.Sources[0].ServiceAccountToken; tok.Audience != "carve-controller" || tok.Path != "token" ||
		tok.ExpirationSeconds == nil || *tok.ExpirationSeconds != 3600 {
		t.Errorf("the node channel token is %+v, want audience carve-controller, path token, expirationSeconds 3600", tok)
	}
	metricsAddr, _ := flagValue(plugin.Args, "--metrics-address")
	ports := map[string]int32{}
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			ports[p.Name] = p.ContainerPort
		}
	}
	if !strings.HasSuffix(metricsAddr, ":"+itoa(ports["metrics"])) || ports["metrics"] == 0 {
		t.Errorf("--metrics-address=%q does not listen on the metrics port %d", metricsAddr, ports["metrics"])
	}
	if addr, _ := flagValue(plugin.Args, "--node-channel-address"); !strings.HasSuffix(addr, ":"+itoa(ports["node-channel"])) || ports["node-channel"] == 0 {
		t.Errorf("--node-channel-address=%q does not listen on the node-channel port %d", addr, ports["node-channel"])
	}
	if addr, _ := flagValue(plugin.Args, "--node-copy-address"); !strings.HasSuffix(addr, ":"+itoa(ports["node-copy"])) || ports["node-copy"] == 0 {
		t.Errorf("--node-copy-address=%q does not listen on the node-copy port %d", addr, ports["node-copy"])
	}
	svc := get[*corev1.Service](t, objs, "Service carve-system/carve-node-metrics")
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("the metrics Service targets %+v, want the port named metrics", svc.Spec.Ports)
	}
	if !reflect.DeepEqual(svc.Spec.Selector, ds.Spec.Template.Labels) {
		t.Errorf("the metrics Service selects %v, the node pods carry %v", svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	if got := envFrom(plugin); got["NODE_NAME"] != "spec.nodeName" || got["POD_IP"] != "status.podIP" {
		t.Errorf("plugin NODE_NAME comes from %q and POD_IP from %q, want spec.nodeName and status.podIP", got["NODE_NAME"], got["POD_IP"])
	}

	// Registration: the socket goes into the kubelet's plugins_registry as
	// the container mounts it, and the kubelet is told the CSI socket's
	// path on the host: the socket-dir host path, where --endpoint's /csi
	// is mounted.
	if got, _ := flagValue(plugin.Args, "--kubelet-registration-dir"); got == "" || hostPaths[mounts[got].Name] != "/var/lib/kubelet/plugins_registry" {
		t.Errorf("--kubelet-registration-dir=%q is not where the plugin mounts /var/lib/kubelet/plugins_registry", got)
	}
	if got, _ := flagValue(plugin.Args, "--kubelet-csi-socket"); got != hostPaths[mounts["/csi"].Name]+"/csi.sock" {
		t.Errorf("--kubelet-csi-socket=%q is not the --endpoint socket in the socket-dir host path %q", got, hostPaths[mounts["/csi"].Name])
	}
	// IO limits go into pods' cgroups: the host's hierarchy, not the
	// container's own view of it.
	if got, _ := flagValue(plugin.Args, "--cgroup-root"); got == "" || hostPaths[mounts[got].Name] != "/sys/fs/cgroup" {
		t.Errorf("--cgroup-root=%q is not where the plugin mounts the host's /sys/fs/cgroup", got)
	}

	// The kubelet probes carve itself, on the metrics port: liveness at
	// /healthz, readiness at /readyz.
	for _, tc := range []struct {
		kind  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", plugin.LivenessProbe, "/healthz"},
		{"readiness", plugin.ReadinessProbe, "/readyz"},
	} {
		if tc.probe == nil || tc.probe.HTTPGet == nil || tc.probe.HTTPGet.Path != tc.path || tc.probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("the plugin's %s probe is %+v, want GET %s on the metrics port", tc.kind, tc.probe, tc.path)
		}
	}
	if want := map[string]int32{"metrics": 9810, "node-channel": 9809, "node-copy": 9811}; !reflect.DeepEqual(ports, want) {
		t.Errorf("the node pod declares ports %v; want %v (carve's metrics, the node channel and copies across nodes)", ports, want)
	}
}

// envFrom maps a container's environment variables set from a field of
// the pod to that field's path.
func envFrom(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			m[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	return m
}

// nodeConfigVolume returns what the node pod's /etc/carve holds: the
// device-class ConfigMap it projects, and whether it also projects the
// node channel's CA bundle (ca.crt of the optional ConfigMap
// carve-node-channel-ca) as node-channel/ca.crt.
func nodeConfigVolume(t *testing.T, spec corev1.PodSpec) (deviceClasses string, caBundle bool) {
	t.Helper()
	var name string
	for _, m := range container(t, spec, "carve").VolumeMounts {
		if m.MountPath == "/etc/carve" {
			if !m.ReadOnly {
				t.Error("/etc/carve is mounted writable")
			}
			name = m.Name
		}
	}
	for _, v := range spec.Volumes {
		if v.Name != name || v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			cm := src.ConfigMap
			switch {
			case cm == nil:
			case cm.Name == "carve-node-channel-ca":
				caBundle = cm.Optional != nil && *cm.Optional &&
					reflect.DeepEqual(cm.Items, []corev1.KeyToPath{{Key: "ca.crt", Path: "node-channel/ca.crt"}})
			default:
				deviceClasses = cm.Name
			}
		}
	}
	return deviceClasses, caBundle
}

// TestNodeRunsOnlyTheAgent: every node DaemonSet, node groups' included,
// runs one container, carve node; no sidecar runs on the nodes.
func TestNodeRunsOnlyTheAgent(t *testing.T) {
	objs := typedObjects(t, renderChartValues(t, `
nodeGroups:
  - name: nvme
    deviceClasses: [{name: fast, volumeGroup: nvme}]
`))
	for _, key := range []string{nodeDS, "DaemonSet carve-system/carve-node-nvme"} {
		tmpl, ok := podSpecOf(t, objs, key)
		if !ok {
			t.Fatalf("no %s rendered: %v", key, sortedKeys(objs))
		}
		if cs := tmpl.Spec.Containers; len(cs) != 1 || cs[0].Name != "carve" || len(cs[0].Args) == 0 || cs[0].Args[0] != "node" {
			t.Errorf("%s runs %d containers (%+v), want carve node alone", key, len(cs), cs)
		} else if !reflect.DeepEqual(cs[0].Command, nodeAgentCommand) {
			t.Errorf("%s runs %v plugin, want %v plugin", key, cs[0].Command, nodeAgentCommand)
		}
		if len(tmpl.Spec.InitContainers) > 0 {
			t.Errorf("%s has init containers %+v", key, tmpl.Spec.InitContainers)
		}
	}
}

// TestNodeChannelService: the headless Service carve controller finds the
// node agents by selects the node pods of every node group (and no
// controller pod), on the port the pods name node-channel, and is the one
// --node-channel-service names.
func TestNodeChannelService(t *testing.T) {
	objs := typedObjects(t, renderChartValues(t, `
nodeGroups:
  - name: nvme
    deviceClasses: [{name: fast, volumeGroup: nvme}]
  - name: hdd
    deviceClasses: [{name: bulk, volumeGroup: hdd}]
`))
	svc, ok := objs["Service carve-system/carve-node"].(*corev1.Service)
	if !ok {
		t.Fatalf("no Service carve-node: %v", sortedKeys(objs))
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service carve-node: clusterIP %q, want None (headless: the controller dials each pod)", svc.Spec.ClusterIP)
	}
	if p := svc.Spec.Ports; len(p) != 1 || p[0].Name != "node-channel" || p[0].Port != 9809 || p[0].TargetPort.String() != "node-channel" || p[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("Service carve-node ports %+v, want node-channel 9809/TCP targeting node-channel", p)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	for _, key := range []string{nodeDS, "DaemonSet carve-system/carve-node-nvme", "DaemonSet carve-system/carve-node-hdd"} {
		tmpl, ok := podSpecOf(t, objs, key)
		if !ok {
			t.Fatalf("no %s rendered", key)
		}
		if !sel.Matches(labels.Set(tmpl.Labels)) {
			t.Errorf("Service carve-node (selector %v) does not select the pods of %s (%v)", svc.Spec.Selector, key, tmpl.Labels)
		}
		if !slices.ContainsFunc(container(t, tmpl.Spec, "carve").Ports, func(p corev1.ContainerPort) bool { return p.Name == "node-channel" && p.ContainerPort == 9809 }) {
			t.Errorf("%s declares no port node-channel 9809", key)
		}
	}
	ctrl, _ := podSpecOf(t, objs, controllerD)
	if sel.Matches(labels.Set(ctrl.Labels)) {
		t.Errorf("Service carve-node selects the controller pods %v", ctrl.Labels)
	}
	if got, _ := flagValue(container(t, ctrl.Spec, "carve").Args, "--node-channel-service"); got != svc.Name {
		t.Errorf("carve controller --node-channel-service=%q, want %s", got, svc.Name)
	}
}

// TestNodeChannelNetworkPolicy: the component (and the chart's
// networkPolicy.enabled) admits to the node pods' node channel only the
// controller pods, and to their metrics port (unauthenticated /metrics
// and /readyz) only the namespace "monitoring" (networkPolicy.metricsFrom).
func TestNodeChannelNetworkPolicy(t *testing.T) {
	objs := map[string]runtime.Object{}
	for _, o := range renderWithComponent(t, "node-channel-network-policy") {
		objs[o.key()] = typed(t, o)
	}
	np := get[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy carve-system/carve-node-channel")
	if _, ok := baseObjects(t)["NetworkPolicy carve-system/carve-node-channel"]; ok {
		t.Error("the base without the component renders the NetworkPolicy")
	}
	ds := get[*appsv1.DaemonSet](t, objs, "DaemonSet carve-system/carve-node")
	d := get[*appsv1.Deployment](t, objs, "Deployment carve-system/carve-controller")
	pods, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	if !pods.Matches(labels.Set(ds.Spec.Template.Labels)) || !pods.Matches(labels.Set{"app.kubernetes.io/name": "carve", "app.kubernetes.io/component": "node", "carve.dev/node-group": "nvme"}) {
		t.Errorf("the NetworkPolicy's podSelector %v does not select the node pods (of node groups too)", np.Spec.PodSelector)
	}
	if pods.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the NetworkPolicy's podSelector %v selects the controller pods", np.Spec.PodSelector)
	}
	if !reflect.DeepEqual(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %v, want [Ingress] (the node's egress is not restricted)", np.Spec.PolicyTypes)
	}
	// Who may reach each of the node pod's ports.
	from := map[string][]networkingv1.NetworkPolicyPeer{}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			t.Errorf("ingress rule %+v admits every port", r)
		}
		for _, p := range r.Ports {
			if p.Port == nil || (p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP) {
				t.Errorf("ingress port %+v, want a named TCP port", p)
				continue
			}
			from[p.Port.String()] = append(from[p.Port.String()], r.From...)
			if len(r.From) == 0 {
				from[p.Port.String()] = append(from[p.Port.String()], networkingv1.NetworkPolicyPeer{}) // anyone
			}
		}
	}
	monitoring := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{
		MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}
	if peers := from["metrics"]; len(peers) != 1 || !reflect.DeepEqual(peers[0], monitoring) {
		t.Errorf("the metrics port admits %+v, want only the namespace monitoring", peers)
	}
	peers := from["node-channel"]
	if len(peers) != 1 || peers[0].PodSelector == nil || peers[0].NamespaceSelector != nil || peers[0].IPBlock != nil {
		t.Fatalf("the node channel admits %+v, want only pods of this namespace", peers)
	}
	ctrl, err := metav1.LabelSelectorAsSelector(peers[0].PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	if !ctrl.Matches(labels.Set(d.Spec.Template.Labels)) || ctrl.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("the node channel admits pods %v: want the controller pods %v and not the node pods", peers[0].PodSelector, d.Spec.Template.Labels)
	}
	// Copies across nodes (on by default): the node pods only.
	nodePods := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{
		MatchLabels: map[string]string{"app.kubernetes.io/name": "carve", "app.kubernetes.io/component": "node"}}}
	if peers := from["node-copy"]; len(peers) != 1 || !reflect.DeepEqual(peers[0], nodePods) {
		t.Errorf("the node-copy port admits %+v, want only the node pods", peers)
	}
	if len(from) != 3 {
		t.Errorf("the NetworkPolicy opens ports %v, want metrics, node-channel and node-copy", from)
	}
}

// checkNodeSelection: the DaemonSet runs on Linux nodes only, tolerates no
// taint by default (a blanket toleration put it on control-plane and
// dedicated nodes), stays off nodes labelled for a node group (their own
// DaemonSets run there, and a DaemonSet selector must not take their
// pods), and never runs two plugins on one node during a rollout.
func checkNodeSelection(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v does not pick Linux nodes", spec.NodeSelector)
	}
	if len(spec.Tolerations) > 0 {
		t.Errorf("tolerations %+v; by default the DaemonSet tolerates no taint", spec.Tolerations)
	}
	excludes := func(reqs []corev1.NodeSelectorRequirement) bool {
		return slices.ContainsFunc(reqs, func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == "carve.dev/node-group" && r.Operator == corev1.NodeSelectorOpDoesNotExist
		})
	}
	a := spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
		!slices.ContainsFunc(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms, func(term corev1.NodeSelectorTerm) bool {
			return excludes(term.MatchExpressions)
		}) {
		t.Errorf("affinity %+v does not keep the DaemonSet off nodes labelled carve.dev/node-group", a)
	}
	if !slices.ContainsFunc(ds.Spec.Selector.MatchExpressions, func(r metav1.LabelSelectorRequirement) bool {
		return r.Key == "carve.dev/node-group" && r.Operator == metav1.LabelSelectorOpDoesNotExist
	}) {
		t.Errorf("selector %+v would take the pods of node groups' DaemonSets", ds.Spec.Selector)
	}
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil || ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 0 || ru.MaxUnavailable == nil {
		t.Errorf("updateStrategy %+v, want RollingUpdate with maxSurge 0 and a maxUnavailable", ds.Spec.UpdateStrategy)
	}
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

func TestControllerDeployment(t *testing.T) {
	objs := baseObjects(t)
	d := get[*appsv1.Deployment](t, objs, "Deployment carve-system/carve-controller")
	// Two replicas: every one routes, leader election picks one of each
	// sidecar, so losing a node does not stop provisioning.
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	spec := d.Spec.Template.Spec
	if spec.ServiceAccountName != "carve-controller" {
		t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
	}
	var names []string
	for _, c := range spec.Containers {
		names = append(names, c.Name)
	}
	if want := []string{"carve", "csi-provisioner", "csi-snapshotter", "csi-resizer"}; !reflect.DeepEqual(names, want) {
		t.Errorf("containers %v, want %v", names, want)
	}
	carve := container(t, spec, "carve")
	if len(carve.Args) == 0 || carve.Args[0] != "controller" {
		t.Errorf("carve args %v do not start with the controller role", carve.Args)
	}
	for flag, want := range map[string]string{
		"--endpoint":             "unix:///csi/csi.sock",
		"--metrics-address":      "0.0.0.0:9810",
		"--node-channel-service": "carve-node",
	} {
		if got, _ := flagValue(carve.Args, flag); got != want {
			t.Errorf("controller %s=%q, want %q", flag, got, want)
		}
	}
	if got := envFrom(carve); got["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("controller POD_NAMESPACE comes from %q, want metadata.namespace", got["POD_NAMESPACE"])
	}
	// No container needs root.
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("the controller pod's securityContext %+v: want runAsNonRoot, a non-zero runAsUser and seccompProfile RuntimeDefault", psc)
	}
	for _, c := range spec.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("container %s: securityContext %+v, want no privilege escalation and all capabilities dropped", c.Name, sc)
		}
		if c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
			t.Errorf("container %s: terminationMessagePolicy %q, want FallbackToLogsOnError", c.Name, c.TerminationMessagePolicy)
		}
		// Every container talks to carve controller on the pod's socket.
		if m := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/csi" }); m < 0 {
			t.Errorf("container %s does not mount /csi", c.Name)
		}
	}
	pdb := get[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget carve-system/carve-controller")
	if !reflect.DeepEqual(pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget %+v: want maxUnavailable 1 over the controller's pods %v", pdb.Spec, d.Spec.Selector.MatchLabels)
	}
	resizer := container(t, spec, "csi-resizer")
	if !slices.Contains(resizer.Args, "--leader-election") {
		t.Errorf("csi-resizer args %v lack --leader-election", resizer.Args)
	}
	// A replica that stops dead keeps its leases until they expire: the
	// other replica's sidecars take over within lease + one retry, which
	// must leave room in issue 21's 20 s for the new leader to start.
	for _, name := range []string{"csi-provisioner", "csi-snapshotter", "csi-resizer"} {
		args := container(t, spec, name).Args
		dur := func(flag string) time.Duration {
			v, _ := flagValue(args, flag)
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Errorf("%s %s=%q: %v", name, flag, v, err)
			}
			return d
		}
		lease, renew, retry := dur("--leader-election-lease-duration"), dur("--leader-election-renew-deadline"), dur("--leader-election-retry-period")
		if lease+retry > 15*time.Second || retry >= renew || renew >= lease {
			t.Errorf("%s leases %v/%v/%v: want retry < renew < lease and a takeover (lease + retry) within 15 s", name, lease, renew, retry)
		}
	}
	if got, _ := flagValue(resizer.Args, "--csi-address"); got != "/csi/csi.sock" {
		t.Errorf("csi-resizer --csi-address=%q", got)
	}
	prov := container(t, spec, "csi-provisioner")
	if !reflect.DeepEqual(prov.Args, provisionerFlags) {
		t.Errorf("csi-provisioner args\n got %q\nwant %q (carve's design)", prov.Args, provisionerFlags)
	}
	snap := container(t, spec, "csi-snapshotter")
	if !reflect.DeepEqual(snap.Args, snapshotterFlags) {
		t.Errorf("csi-snapshotter args\n got %q\nwant %q (carve's design)", snap.Args, snapshotterFlags)
	}
	for _, c := range []corev1.Container{prov, snap} {
		if got, want := envFrom(c), map[string]string{"NAMESPACE": "metadata.namespace"}; !reflect.DeepEqual(got, want) {
			t.Errorf("%s env %v, want %v ($(NAMESPACE) of --leader-election-namespace)", c.Name, got, want)
		}
	}
	// The sidecars' leader-election health checks, where they serve one.
	for _, tc := range []struct {
		c    corev1.Container
		port string
	}{{prov, "prov-metrics"}, {snap, "snap-metrics"}, {resizer, "resizer-hz"}} {
		p := tc.c.LivenessProbe
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz/leader-election" || p.HTTPGet.Port.String() != tc.port {
			t.Errorf("%s livenessProbe %+v, want GET /healthz/leader-election on %s", tc.c.Name, p, tc.port)
		}
	}
	// carve controller's, csi-provisioner's, csi-snapshotter's and
	// csi-resizer's /metrics are behind a Service of their own each (one
	// scrape job each), on the ports the processes listen on.
	for _, tc := range []struct {
		service, port, flag string
		c                   corev1.Container
	}{
		{"carve-controller-metrics", "metrics", "--metrics-address", carve},
		{"carve-provisioner-metrics", "prov-metrics", "--http-endpoint", prov},
		{"carve-resizer-metrics", "resizer-hz", "--http-endpoint", resizer},
		{"carve-snapshotter-metrics", "snap-metrics", "--http-endpoint", snap},
	} {
		svc := get[*corev1.Service](t, objs, "Service carve-system/"+tc.service)
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != tc.port {
			t.Errorf("Service %s ports %+v, want one named metrics targeting %s", tc.service, svc.Spec.Ports, tc.port)
		}
		if !reflect.DeepEqual(svc.Spec.Selector, d.Spec.Template.Labels) {
			t.Errorf("Service %s selects %v, the controller pods carry %v", tc.service, svc.Spec.Selector, d.Spec.Template.Labels)
		}
		addr, _ := flagValue(tc.c.Args, tc.flag)
		var port int32
		for _, p := range tc.c.Ports {
			if p.Name == tc.port {
				port = p.ContainerPort
			}
		}
		if port == 0 || !strings.HasSuffix(addr, ":"+itoa(port)) {
			t.Errorf("%s %s=%q does not listen on its port %s (%d)", tc.c.Name, tc.flag, addr, tc.port, port)
		}
	}
}

// TestControllerProvisionerCentral: csi-provisioner runs once, in the
// controller Deployment, in central mode: without --node-deployment (which
// would make it act only for the node it runs on), with --strict-topology
// (CreateVolume gets only the selected node, which carve controller routes
// to) and without capacity tracking (carve controller writes the
// CSIStorageCapacity objects). csi-snapshotter likewise runs without
// --node-deployment, under leader election.
func TestControllerProvisionerCentral(t *testing.T) {
	objs := baseObjects(t)
	spec := get[*appsv1.Deployment](t, objs, "Deployment carve-system/carve-controller").Spec.Template.Spec
	prov := container(t, spec, "csi-provisioner")
	for _, tc := range []struct {
		flag string
		want bool
	}{
		{"--node-deployment", false},
		{"--enable-capacity", false},
		{"--strict-topology", true},
		{"--leader-election", true},
	} {
		has := slices.ContainsFunc(prov.Args, func(a string) bool { return a == tc.flag || strings.HasPrefix(a, tc.flag+"=") })
		if has != tc.want {
			t.Errorf("csi-provisioner args %q: %s present %v, want %v", prov.Args, tc.flag, has, tc.want)
		}
	}
	snap := container(t, spec, "csi-snapshotter")
	if slices.Contains(snap.Args, "--node-deployment") || !slices.Contains(snap.Args, "--leader-election") {
		t.Errorf("csi-snapshotter args %q: want --leader-election and no --node-deployment", snap.Args)
	}
}

// renderChartValues renders the chart with a values file, failing the test
// when helm fails.
func renderChartValues(t *testing.T, values string) []object {
	t.Helper()
	objs, err := renderValues(t, values)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestImagesAndResources: every container runs a pinned image and asks for
// CPU and memory.
func TestImagesAndResources(t *testing.T) {
	objs := baseObjects(t)
	specs := map[string]corev1.PodSpec{
		"carve-node":       get[*appsv1.DaemonSet](t, objs, "DaemonSet carve-system/carve-node").Spec.Template.Spec,
		"carve-controller": get[*appsv1.Deployment](t, objs, "Deployment carve-system/carve-controller").Spec.Template.Spec,
	}
	seen := map[string]bool{}
	for workload, spec := range specs {
		for _, c := range spec.Containers {
			want, ok := pinnedImages[c.Name]
			if !ok {
				t.Errorf("%s/%s: no pinned image known for this container", workload, c.Name)
			} else if c.Image != want {
				t.Errorf("%s/%s runs %s, want %s", workload, c.Name, c.Image, want)
			}
			seen[c.Name] = true
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("%s/%s has no CPU or memory request", workload, c.Name)
			}
		}
	}
	for name := range pinnedImages {
		if !seen[name] {
			t.Errorf("no container %s runs", name)
		}
	}
}

// rule is one RBAC permission: verb on a resource in an API group, limited
// to one object's name when name is set.
type rule struct{ scope, group, resource, verb, name string }

func (r rule) String() string {
	s := r.scope + " " + r.group + "/" + r.resource + " " + r.verb
	if r.name != "" {
		s += " " + r.name
	}
	return s
}

// TestRBACLeastPrivilege compares what each service account may do with the
// list of what its containers really need, permission by permission, so a
// new wildcard or a stray verb fails.
func TestRBACLeastPrivilege(t *testing.T) {
	checkGrants(t, baseObjects(t), map[string][]rule{
		// Nothing: the node agent uses no API.
		"carve-system/carve-node": nil,
		"carve-system/carve-controller": slices.Concat(
			// csi-provisioner (central mode), csi-resizer, the lost-node
			// watch, the audit (PVs, a claim's get, Events), the node
			// channel's informers and the placement of restores (claims:
			// list, watch, patch; snapshots and their contents: get, list,
			// watch; events).
			expand("cluster", "", "nodes", "get", "list", "watch"),
			expand("cluster", "", "persistentvolumes", "get", "list", "watch", "create", "patch", "delete"),
			expand("cluster", "", "persistentvolumeclaims", "get", "list", "watch", "update", "patch"),
			expand("cluster", "", "persistentvolumeclaims/status", "patch"),
			expand("cluster", "storage.k8s.io", "storageclasses", "get", "list", "watch"),
			expand("cluster", "storage.k8s.io", "csinodes", "get", "list", "watch"),
			expand("cluster", "storage.k8s.io", "volumeattributesclasses", "get", "list", "watch"),
			expand("cluster", "", "events", "list", "watch", "create", "update", "patch"),
			// csi-provisioner restoring from a snapshot.
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshots", "get", "list", "watch", "update"),
			// csi-provisioner (get, list) and csi-snapshotter.
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshotcontents", "get", "list", "watch", "update", "patch"),
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshotcontents/status", "update", "patch"),
			expand("cluster", "snapshot.storage.k8s.io", "volumesnapshotclasses", "get", "list", "watch"),
			// Leader election of the sidecars and carve controller.
			expand("namespace", "coordination.k8s.io", "leases", "get", "list", "watch", "create", "update", "delete"),
			// The node channel: enrollment, discovery, capacity, the CA.
			expand("cluster", "authentication.k8s.io", "tokenreviews", "create"),
			expand("namespace", "discovery.k8s.io", "endpointslices", "list", "watch"),
			expand("namespace", "storage.k8s.io", "csistoragecapacities", "get", "list", "watch", "create", "update", "delete"),
			expand("namespace", "", "secrets", "create"),
			expandNamed("namespace", "", "secrets", "carve-node-channel-ca", "get", "update"),
			// The key-encryption keys of encrypted volumes.
			expandNamed("namespace", "", "secrets", "carve-volume-kek", "get", "update"),
			expand("namespace", "", "configmaps", "create"),
			expandNamed("namespace", "", "configmaps", "carve-node-channel-ca", "get", "update"),
			// The mover (kubectl carve move): it deletes the claim and
			// makes it again, stops the pods that use it, and writes the
			// old PV's annotations, reclaim policy and claimRef.
			expand("cluster", "", "persistentvolumeclaims", "create", "delete"),
			expand("cluster", "", "persistentvolumes", "update"),
			expand("cluster", "", "pods", "list", "delete"),
			// The placement of restores watches the pods that wait for a
			// node (and lists a source node's pods: what they request).
			expand("cluster", "", "pods", "watch"),
		),
	})
}

// TestNodeCannotWriteVolumes: the node agents' service account is granted
// nothing, whatever the chart's values: a node that is taken over cannot
// reach beyond its own disks through the API. (The node agent uses no API:
// carve controller audits its LVs over the node channel.)
func TestNodeCannotWriteVolumes(t *testing.T) {
	for _, values := range []string{
		"",
		"controller: {deleteClaimsOfLostNodes: true, audit: {removeOrphans: true}}\nnetworkPolicy: {enabled: true}\n",
		"nodeGroups: [{name: nvme, deviceClasses: [{name: fast, volumeGroup: nvme}]}]\n",
	} {
		objs := map[string]runtime.Object{}
		for _, o := range renderChartValues(t, values) {
			objs[o.key()] = typed(t, o)
		}
		for r := range grants(t, objs)["carve-system/carve-node"] {
			t.Errorf("values %q: carve-node may %s; it must be granted nothing", values, r)
		}
		for key, o := range objs {
			if sa, ok := o.(*corev1.ServiceAccount); ok && sa.Name == "carve-node" &&
				(sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken) {
				t.Errorf("values %q: %s mounts an API token by default", values, key)
			}
		}
	}
}

// expand lists one rule per verb.
func expand(scope, group, resource string, verbs ...string) []rule {
	var rs []rule
	for _, v := range verbs {
		rs = append(rs, rule{scope, group, resource, v, ""})
	}
	return rs
}

// expandNamed lists one rule per verb on the object name alone.
func expandNamed(scope, group, resource, name string, verbs ...string) []rule {
	var rs []rule
	for _, v := range verbs {
		rs = append(rs, rule{scope, group, resource, v, name})
	}
	return rs
}

// grants lists the permissions the roles and bindings among objs give each
// service account (namespace/name).
func grants(t *testing.T, objs map[string]runtime.Object) map[string]map[rule]bool {
	t.Helper()
	rolesByKey := map[string][]rbacv1.PolicyRule{}
	for _, o := range objs {
		switch r := o.(type) {
		case *rbacv1.ClusterRole:
			rolesByKey["ClusterRole/"+r.Name] = r.Rules
		case *rbacv1.Role:
			rolesByKey["Role/"+r.Namespace+"/"+r.Name] = r.Rules
		}
	}
	granted := map[string]map[rule]bool{}
	grant := func(subjects []rbacv1.Subject, roleKey, scope string) {
		rules, ok := rolesByKey[roleKey]
		if !ok {
			t.Errorf("a binding refers to %s, which is not rendered", roleKey)
		}
		for _, s := range subjects {
			if s.Kind != "ServiceAccount" {
				t.Errorf("binding subject %+v is not a service account", s)
				continue
			}
			sa := s.Namespace + "/" + s.Name
			if granted[sa] == nil {
				granted[sa] = map[rule]bool{}
			}
			for _, r := range rules {
				names := r.ResourceNames
				if len(names) == 0 {
					names = []string{""}
				}
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						for _, v := range r.Verbs {
							for _, n := range names {
								granted[sa][rule{scope, g, res, v, n}] = true
							}
						}
					}
				}
			}
		}
	}
	for _, o := range objs {
		switch b := o.(type) {
		case *rbacv1.ClusterRoleBinding:
			grant(b.Subjects, "ClusterRole/"+b.RoleRef.Name, "cluster")
		case *rbacv1.RoleBinding:
			grant(b.Subjects, "Role/"+b.Namespace+"/"+b.RoleRef.Name, "namespace")
		}
	}
	return granted
}

// checkGrants compares the permissions the roles and bindings among objs
// give each service account with want, and fails on any extra or missing
// one, or on a service account want does not name.
func checkGrants(t *testing.T, objs map[string]runtime.Object, want map[string][]rule) {
	t.Helper()
	granted := grants(t, objs)
	for sa, rules := range want {
		wantSet := map[rule]bool{}
		for _, r := range rules {
			wantSet[r] = true
		}
		var extra, missing []string
		for r := range granted[sa] {
			if !wantSet[r] {
				extra = append(extra, r.String())
			}
		}
		for r := range wantSet {
			if !granted[sa][r] {
				missing = append(missing, r.String())
			}
		}
		sort.Strings(extra)
		sort.Strings(missing)
		if len(extra) > 0 || len(missing) > 0 {
			t.Errorf("%s: granted but not needed %q; needed but not granted %q", sa, extra, missing)
		}
	}
	for sa := range granted {
		if _, ok := want[sa]; !ok {
			t.Errorf("%s is granted permissions nobody listed", sa)
		}
	}
}

// TestDeviceClassesAndStorageClasses: the ConfigMap is a valid device-class
// file, and every StorageClass names one of its classes.
func TestDeviceClassesAndStorageClasses(t *testing.T) {
	objs := baseObjects(t)
	cm := get[*corev1.ConfigMap](t, objs, "ConfigMap carve-system/carve-device-classes")
	// The plugin's own parser: strict keys, one default, valid names and
	// options.
	cfg, err := deviceclass.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("config.yaml is not a valid device-class file: %v", err)
	}
	classes := map[string]*deviceclass.DeviceClass{}
	defaults := 0
	for i := range cfg.DeviceClasses {
		c := &cfg.DeviceClasses[i]
		classes[c.Name] = c
		if c.Default {
			defaults++
		}
	}
	if defaults != 1 {
		t.Errorf("%d default device classes, want 1", defaults)
	}
	wantFS := map[string]struct{ class, fs string }{
		"carve-thick-ext4": {"thick", "ext4"},
		"carve-thin-xfs":   {"thin", "xfs"},
	}
	for name, want := range wantFS {
		sc := get[*storagev1.StorageClass](t, objs, "StorageClass /"+name)
		if sc.Provisioner != "lvm.carve.dev" {
			t.Errorf("%s: provisioner %q", name, sc.Provisioner)
		}
		if sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
			t.Errorf("%s: binding mode is not WaitForFirstConsumer", name)
		}
		if sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
			t.Errorf("%s: expansion not allowed", name)
		}
		if sc.ReclaimPolicy == nil || *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
			t.Errorf("%s: reclaim policy is not Delete", name)
		}
		class := sc.Parameters["carve.dev/device-class"]
		if class != want.class {
			t.Errorf("%s: device class %q, want %q", name, class, want.class)
		}
		if _, ok := classes[class]; !ok {
			t.Errorf("%s names device class %q, which config.yaml does not define", name, class)
		}
		if sc.Parameters["csi.storage.k8s.io/fstype"] != want.fs {
			t.Errorf("%s: fstype %q, want %q", name, sc.Parameters["csi.storage.k8s.io/fstype"], want.fs)
		}
		if want.class == "thin" && !classes[class].Thin() {
			t.Errorf("%s: device class %q is not thin", name, class)
		}
	}
}

// TestPinnedVersionsInDocs: docs/install.md lists the same sidecar images.
func TestPinnedVersionsInDocs(t *testing.T) {
	doc := readRepoFile(t, "docs", "install.md")
	for name, image := range pinnedImages {
		if !strings.Contains(string(doc), image) {
			t.Errorf("docs/install.md does not mention %s (%s)", image, name)
		}
	}
}
