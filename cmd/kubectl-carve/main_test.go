package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/internal/kubectl/view"
	"github.com/carve-csi/carve/internal/topology"
)

const driver = "lvm.carve.dev"

var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// kubeconfig writes a kubeconfig whose context's namespace is "db".
func kubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config")
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: bed, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: admin, user: {token: x}}]
contexts: [{name: bed, context: {cluster: bed, user: admin, namespace: db}}]
current-context: bed
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func cluster() ([]runtime.Object, []runtime.Object) {
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	pv := func(name, node, ns, claim string, created time.Time) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
			Spec: corev1.PersistentVolumeSpec{
				StorageClassName: "carve-thick",
				Capacity:         corev1.ResourceList{corev1.ResourceStorage: q("1Gi")},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: driver, VolumeHandle: "carve/carve-" + name, VolumeAttributes: map[string]string{"carve.dev/device-class": "thick"}}},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: topology.Key, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
				ClaimRef: &corev1.ObjectReference{Namespace: ns, Name: claim},
			},
			Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
	}
	claim := func(ns, name, volume string, phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
		sc := "carve-thick"
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			CreationTimestamp: metav1.NewTime(now.Add(-26 * time.Hour))},
			Spec:   corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeName: volume},
			Status: corev1.PersistentVolumeClaimStatus{Phase: phase, Capacity: corev1.ResourceList{corev1.ResourceStorage: q("1Gi")}}}
	}
	usedBy := func(ns, name, claim string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{Volumes: []corev1.Volume{{
			Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	}
	capacity := q("10Gi")
	objs := []runtime.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "carve-thick"}, Provisioner: driver,
			Parameters: map[string]string{"carve.dev/device-class": "thick"}},
		pv("pv-a", "n1", "db", "data-0", now.Add(-3*24*time.Hour)), pv("pv-b", "n2", "web", "cache", now.Add(-90*time.Second)),
		claim("db", "data-0", "pv-a", corev1.ClaimBound), claim("web", "cache", "pv-b", corev1.ClaimBound),
		claim("db", "waiting", "", corev1.ClaimPending),
		usedBy("db", "db-0", "data-0"), usedBy("web", "cache-0", "cache"),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "carve-system", Name: "carve-node-x", CreationTimestamp: metav1.NewTime(now.Add(-5 * time.Minute)),
			Labels: map[string]string{"app.kubernetes.io/name": "carve", "app.kubernetes.io/component": "node"}},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "carve", Image: "carve:v0.1.0"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, StartTime: &metav1.Time{Time: now.Add(-5 * time.Minute)},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}},
		&storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: driver}}}},
		&storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Namespace: "carve-system", Name: "csisc-1"},
			NodeTopology: &metav1.LabelSelector{MatchLabels: map[string]string{topology.Key: "n1"}}, StorageClassName: "carve-thick",
			Capacity: &capacity},
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "e1"}, Type: "Normal", Reason: "WaitForFirstConsumer",
			Message: "waiting for first consumer", InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "db", Name: "waiting"},
			LastTimestamp: metav1.NewTime(now.Add(-time.Minute))},
	}
	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"namespace": "db", "name": "nightly"},
		"spec":     map[string]any{"source": map[string]any{"persistentVolumeClaimName": "data-0"}},
		"status":   map[string]any{"boundVolumeSnapshotContentName": "content-1", "readyToUse": true, "restoreSize": "1Gi"},
	}}
	snap.SetCreationTimestamp(metav1.NewTime(now.Add(-2 * time.Hour)))
	content := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": "content-1"},
		"spec":     map[string]any{"driver": driver},
		"status":   map[string]any{"snapshotHandle": "n1/carve/carvesnap-0a"},
	}}
	return objs, []runtime.Object{snap, content}
}

// tool runs kubectl carve against the fake cluster; it returns the exit
// code, stdout and stderr, and the fake clientset (to read its actions).
func tool(t *testing.T, args ...string) (int, string, string, *fake.Clientset) {
	t.Helper()
	objs, dyn := cluster()
	cs := fake.NewClientset(objs...)
	dc := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		view.SnapshotResource: "VolumeSnapshotList", view.SnapshotContentResource: "VolumeSnapshotContentList"}, dyn...)
	var in, out, errOut bytes.Buffer
	conn := func(genericclioptions.RESTClientGetter) (clients, error) { return clients{kube: cs, dynamic: dc}, nil }
	// The kubeconfig goes first: __complete completes its last word.
	argv := []string{"--kubeconfig", kubeconfig(t)}
	if len(args) > 0 && args[0] == "__complete" {
		argv = append([]string{args[0]}, append(argv, args[1:]...)...)
	} else {
		argv = append(argv, args...)
	}
	code := runAt(argv, genericiooptions.IOStreams{In: &in, Out: &out, ErrOut: &errOut}, conn, now)
	return code, out.String(), errOut.String(), cs
}

// TestUsageErrors: wrong commands and flags exit 2 and say what is wrong,
// before the API is asked anything.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "name a command"},
		{[]string{"-o", "json"}, "name a command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate" for "kubectl carve"`},
		{[]string{"volumes", "-o", "xml"}, `--output "xml": must be one of table, wide, json, yaml, name`},
		{[]string{"volumes", "--frob"}, "unknown flag: --frob"},
		{[]string{"volumes", "extra"}, `unknown command "extra" for "kubectl carve volumes"`},
		{[]string{"describe"}, "describe takes one claim name, got 0"},
		{[]string{"describe", "a", "b"}, "describe takes one claim name, got 2"},
		{[]string{"describe", "a", "-A"}, "name its namespace with -n, not -A"},
	} {
		var out, errOut bytes.Buffer
		conn := func(genericclioptions.RESTClientGetter) (clients, error) {
			t.Errorf("run(%q) connected to the API", tc.args)
			return clients{}, fmt.Errorf("no")
		}
		code := run(tc.args, genericiooptions.IOStreams{In: &bytes.Buffer{}, Out: &out, ErrOut: &errOut}, conn)
		if code != exitUsage || !strings.Contains(errOut.String(), tc.want) || out.Len() != 0 {
			t.Errorf("run(%q) = %d, stderr %q, stdout %q; want 2 and %q", tc.args, code, errOut.String(), out.String(), tc.want)
		}
	}
}

// TestHelp: --help, -h and help exit 0 and print the usage on stdout,
// naming the plugin as kubectl users type it.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"volumes", "--help"}, {"help", "nodes"}, {"-n", "x", "describe", "-h"}} {
		var out, errOut bytes.Buffer
		code := run(args, genericiooptions.IOStreams{In: &bytes.Buffer{}, Out: &out, ErrOut: &errOut}, nil)
		if code != 0 || !strings.Contains(out.String(), "Usage:\n  kubectl carve") || errOut.Len() != 0 {
			t.Errorf("run(%q) = %d, stdout %q, stderr %q; want 0 and the usage", args, code, out.String(), errOut.String())
		}
	}
}

// TestFlagsInAnyPosition: flags before the command, after it, and in
// --flag=value form mean the same.
func TestFlagsInAnyPosition(t *testing.T) {
	var first string
	for i, args := range [][]string{
		{"volumes", "-o", "json", "-n", "web"},
		{"-o", "json", "volumes", "-n", "web"},
		{"-n", "web", "-o", "json", "volumes"},
		{"--namespace=web", "volumes", "--output=json"},
	} {
		code, out, errOut, _ := tool(t, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errOut)
		}
		if i == 0 {
			first = out
			if !strings.Contains(out, `"claim": "web/cache"`) || strings.Contains(out, "db/") {
				t.Fatalf("%q: %s", args, out)
			}
		} else if out != first {
			t.Errorf("%q prints\n%s\nnot as %q:\n%s", args, out, [][]string{{"volumes", "-o", "json", "-n", "web"}}, first)
		}
	}
}

// TestOutputFormats: each view in kubectl's forms: tables with kubectl's
// spacing and AGE, -A's NAMESPACE column, -o wide's extra columns,
// --no-headers, -o name; the kubeconfig context's namespace by default.
func TestOutputFormats(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"volumes"}, `
PVC      PV     NODE   DEVICE CLASS   LV                 SIZE   STATUS   PODS   AGE
data-0   pv-a   n1     thick          carve/carve-pv-a   1Gi    Bound    db-0   3d
`},
		{[]string{"volumes", "-A"}, `
NAMESPACE   PVC      PV     NODE   DEVICE CLASS   LV                 SIZE   STATUS   PODS      AGE
db          data-0   pv-a   n1     thick          carve/carve-pv-a   1Gi    Bound    db-0      3d
web         cache    pv-b   n2     thick          carve/carve-pv-b   1Gi    Bound    cache-0   90s
`},
		{[]string{"volumes", "-o", "wide", "--no-headers"}, `
data-0   pv-a   n1    thick   carve/carve-pv-a   1Gi   Bound   db-0   3d    carve-thick
`},
		{[]string{"volumes", "-A", "-o", "name"}, `
persistentvolume/pv-a
persistentvolume/pv-b
`},
		{[]string{"pending"}, `
PVC       STORAGECLASS   AGE   SELECTED NODE   PODS     LAST EVENT
waiting   carve-thick    26h   <none>          <none>   WaitForFirstConsumer: waiting for first consumer
`},
		{[]string{"pending", "-o", "name"}, "\npersistentvolumeclaim/waiting\n"},
		{[]string{"capacity", "-n", "web"}, `
NODE   DEVICE CLASS   STORAGECLASS   CAPACITY   MAX VOLUME   VOLUMES   PROVISIONED
n1     thick          carve-thick    10Gi       0            1         1Gi
`},
		{[]string{"nodes"}, `
NODE   AGENT   CHANNEL   REGISTERED   GROUP    VERSION   FREE         AGE   REASON
n1     Ready   None      yes          <none>   v0.1.0    thick=10Gi   5m    <none>
`},
		{[]string{"nodes", "-o", "wide"}, `
NODE   AGENT   CHANNEL   REGISTERED   GROUP    VERSION   FREE         AGE   POD                         REASON
n1     Ready   None      yes          <none>   v0.1.0    thick=10Gi   5m    carve-system/carve-node-x   <none>
`},
		{[]string{"snapshots"}, `
NAME      SOURCE PVC   NODE   READY   RESTORE SIZE   CLASS    AGE
nightly   data-0       n1     true    1Gi            <none>   120m
`},
	} {
		code, out, errOut, _ := tool(t, tc.args...)
		if code != 0 || "\n"+out != tc.want {
			t.Errorf("kubectl carve %s = %d, stderr %q:\n%s\nwant:%s", strings.Join(tc.args, " "), code, errOut, out, tc.want)
		}
	}
}

// TestEmptyListings: an empty table says so on stderr, as kubectl does;
// -o json is still a list.
func TestEmptyListings(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		stdout, stderr string
	}{
		{[]string{"snapshots", "-n", "web"}, "", "No resources found in web namespace.\n"},
		{[]string{"orphans"}, "", "No resources found\n"},
		{[]string{"orphans", "-o", "json"}, "[]\n", ""},
		{[]string{"orphans", "-o", "yaml"}, "[]\n", ""},
	} {
		code, out, errOut, _ := tool(t, tc.args...)
		if code != 0 || out != tc.stdout || errOut != tc.stderr {
			t.Errorf("kubectl carve %s = %d, stdout %q, stderr %q; want %q, %q", strings.Join(tc.args, " "), code, out, errOut, tc.stdout, tc.stderr)
		}
	}
}

// TestStructuredOutput: -o json and -o yaml print the same rows.
func TestStructuredOutput(t *testing.T) {
	for _, view := range []string{"volumes", "pending", "capacity", "nodes", "snapshots", "orphans"} {
		_, j, _, _ := tool(t, view, "-A", "-o", "json")
		_, y, _, _ := tool(t, view, "-A", "-o", "yaml")
		var fromJSON, fromYAML []map[string]any
		if err := json.Unmarshal([]byte(j), &fromJSON); err != nil {
			t.Fatalf("%s -o json: %v\n%s", view, err, j)
		}
		if err := yaml.Unmarshal([]byte(y), &fromYAML); err != nil {
			t.Fatalf("%s -o yaml: %v\n%s", view, err, y)
		}
		if fmt.Sprint(fromJSON) != fmt.Sprint(fromYAML) || (view != "orphans" && len(fromJSON) == 0) {
			t.Errorf("%s: json %v, yaml %v", view, fromJSON, fromYAML)
		}
	}
}

// TestNamespaceScope: the namespaced views read the context's namespace,
// -n's, or all with -A; the node views read the cluster.
func TestNamespaceScope(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // the namespace of every namespaced list
	}{
		{[]string{"volumes"}, "db"},
		{[]string{"pending", "-n", "web"}, "web"},
		{[]string{"volumes", "-A"}, ""},
		{[]string{"-A", "pending", "-n", "web"}, ""},
		{[]string{"describe", "data-0"}, "db"},
	} {
		code, _, errOut, cs := tool(t, tc.args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", tc.args, code, errOut)
		}
		for _, a := range cs.Actions() {
			r := a.GetResource().Resource
			if (r == "pods" || r == "persistentvolumeclaims") && a.GetNamespace() != tc.want {
				t.Errorf("%q: %s %s in namespace %q, want %q", tc.args, a.GetVerb(), r, a.GetNamespace(), tc.want)
			}
		}
	}
}

// TestDescribe: describe prints the claim, its PV and LV, node, pods,
// metrics and events as kubectl describe lays them out.
func TestDescribe(t *testing.T) {
	code, out, errOut, _ := tool(t, "describe", "data-0")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	// Columns are aligned as kubectl describe aligns them; compare words.
	words := regexp.MustCompile(` +`).ReplaceAllString(out, " ")
	for _, want := range []string{
		"Name: data-0\n", "Namespace: db\n", "Status: Bound\n", "Device Class: thick\n",
		"Used By: db-0\n", "Attributes Class: <none>\n", "IO Limits: <none>\n", "Node: n1\n", "Volume: pv-a\n", " Volume Group: carve\n",
		" LV: carve-pv-a\n", "Age: 26h\n",
		` kubelet_volume_stats_used_bytes{namespace="db",persistentvolumeclaim="data-0"}`,
		"Events: <none>\n",
	} {
		if !strings.Contains(words, want) {
			t.Errorf("describe lacks %q:\n%s", want, out)
		}
	}
	code, out, _, _ = tool(t, "describe", "waiting", "-o", "json")
	var c view.Claim
	if err := json.Unmarshal([]byte(out), &c); code != 0 || err != nil || c.Name != "waiting" || len(c.Events) != 1 {
		t.Errorf("describe -o json = %d, %v: %s", code, err, out)
	}
	if code, _, errOut, _ = tool(t, "describe", "nope"); code != exitError || !strings.Contains(errOut, `"nope" not found`) {
		t.Errorf("describe of a missing claim = %d, %q", code, errOut)
	}
}

// TestCompletion: kubectl_complete-carve runs `kubectl-carve __complete`:
// it completes commands, -o values and the claims of the namespace.
func TestCompletion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"__complete", "no"}, []string{"nodes"}},
		{[]string{"__complete", "volumes", "-o", ""}, []string{"table", "wide", "json", "yaml", "name"}},
		{[]string{"__complete", "describe", ""}, []string{"data-0", "waiting"}},
		{[]string{"__complete", "describe", "-n", "web", "c"}, []string{"cache"}},
	} {
		code, out, errOut, _ := tool(t, tc.args...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var got []string
		for _, l := range lines {
			if !strings.HasPrefix(l, ":") {
				name, _, _ := strings.Cut(l, "\t")
				got = append(got, name)
			}
		}
		if code != 0 || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%q = %d, %q (stderr %q); want %q", tc.args, code, got, errOut, tc.want)
		}
	}
}

// TestPendingTable: one aligned row per claim, the last event as
// "reason: message", kubectl's AGE and <none> for what is unknown.
func TestPendingTable(t *testing.T) {
	var out bytes.Buffer
	o := &options{output: "table", allNamespaces: true, streams: genericiooptions.IOStreams{Out: &out, ErrOut: &out}}
	err := o.print(pendingListing([]view.Pending{
		{Claim: "web/waiting", StorageClass: "carve-thick", SelectedNode: "n2", Pods: []string{"web/w"}, Since: now.Add(-90 * time.Second),
			Reason: "ProvisioningFailed", Message: "no room"},
		{Claim: "web/unused", StorageClass: "carve-thin", Since: now.Add(-26 * time.Hour)},
	}, now), "")
	if err != nil {
		t.Fatal(err)
	}
	want := "NAMESPACE   PVC       STORAGECLASS   AGE   SELECTED NODE   PODS     LAST EVENT\n" +
		"web         waiting   carve-thick    90s   n2              w        ProvisioningFailed: no room\n" +
		"web         unused    carve-thin     26h   <none>          <none>   <none>\n"
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
}
