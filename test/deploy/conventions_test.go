//go:build deploytest

package deploy

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestChartConventions: the escape hatches users of TopoLVM's and
// aws-ebs's charts expect (issue 24 item 4) reach the objects they are for.
func TestChartConventions(t *testing.T) {
	const values = `
node:
  extraVolumes: [{name: lvmconf, configMap: {name: my-lvm}}]
  extraVolumeMounts: [{name: lvmconf, mountPath: /etc/lvm/lvm.conf, subPath: lvm.conf}]
  initContainers: [{name: prep, image: "{{ .Values.image.repository }}:prep", command: [/bin/true]}]
  serviceAccount: {name: my-node, annotations: {example.com/role: node}}
controller:
  extraVolumes: [{name: ca, secret: {secretName: ca}}]
  extraVolumeMounts: [{name: ca, mountPath: /ca}]
  initContainers: [{name: wait, image: busybox, command: [/bin/true]}]
  serviceAccount: {create: false, name: my-ctl}
nodeGroups:
  - name: pool-b
    nodeSelector: {cloud.example.com/pool: b}
    kubeletDir: /var/lib/k0s/kubelet
    extraArgs: [--max-volumes=9]
    deviceClasses: [{name: bulk, volumeGroup: hdd}]
  - name: labelled
    deviceClasses: [{name: fast, volumeGroup: nvme}]
`
	objs, err := renderValues(t, values)
	if err != nil {
		t.Fatal(err)
	}
	typedObjs := typedObjects(t, objs)
	pod := func(key string) corev1.PodSpec {
		t.Helper()
		tmpl, ok := podSpecOf(t, typedObjs, key)
		if !ok {
			t.Fatalf("no %s rendered: %v", key, sortedKeys(typedObjs))
		}
		return tmpl.Spec
	}
	hasVolume := func(s corev1.PodSpec, name string) bool {
		return slices.ContainsFunc(s.Volumes, func(v corev1.Volume) bool { return v.Name == name })
	}
	hasMount := func(c corev1.Container, name string) bool {
		return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == name })
	}
	const group, labelled = "DaemonSet carve-system/carve-node-pool-b", "DaemonSet carve-system/carve-node-labelled"
	for _, key := range []string{nodeDS, group, labelled} {
		s := pod(key)
		c := container(t, s, "carve")
		if !hasVolume(s, "lvmconf") || !hasMount(c, "lvmconf") {
			t.Errorf("%s: node.extraVolumes/extraVolumeMounts missing", key)
		}
		if len(s.InitContainers) != 1 || s.InitContainers[0].Image != "ghcr.io/carve-csi/carve:prep" {
			t.Errorf("%s: init containers %+v, want prep with its templated image", key, s.InitContainers)
		}
		if s.ServiceAccountName != "my-node" {
			t.Errorf("%s: serviceAccountName %q, want my-node", key, s.ServiceAccountName)
		}
	}
	ctl := pod(controllerD)
	if c := container(t, ctl, "carve"); !hasVolume(ctl, "ca") || !hasMount(c, "ca") {
		t.Error("controller.extraVolumes/extraVolumeMounts missing")
	}
	if len(ctl.InitContainers) != 1 || ctl.InitContainers[0].Name != "wait" {
		t.Errorf("controller init containers %+v", ctl.InitContainers)
	}
	if ctl.ServiceAccountName != "my-ctl" {
		t.Errorf("controller serviceAccountName %q", ctl.ServiceAccountName)
	}
	if v, ok := flagValue(container(t, ctl, "carve").Args, "--node-service-account"); !ok || v != "my-node" {
		t.Errorf("carve controller --node-service-account=%q (%v), want my-node: it would refuse every node agent", v, ok)
	}

	// Service accounts: the node's made with its annotations, the
	// controller's not made (create: false) but named by every binding.
	sa, ok := typedObjs["ServiceAccount carve-system/my-node"].(*corev1.ServiceAccount)
	if !ok || sa.Annotations["example.com/role"] != "node" {
		t.Errorf("ServiceAccount my-node with its annotation not rendered: %v", sortedKeys(typedObjs))
	}
	for key, o := range typedObjs {
		if strings.HasPrefix(key, "ServiceAccount ") && strings.Contains(key, "controller") || key == "ServiceAccount carve-system/my-ctl" {
			t.Errorf("controller.serviceAccount.create=false still renders %s", key)
		}
		var subjects []rbacv1.Subject
		switch b := o.(type) {
		case *rbacv1.ClusterRoleBinding:
			subjects = b.Subjects
		case *rbacv1.RoleBinding:
			subjects = b.Subjects
		}
		for _, s := range subjects {
			if s.Kind == "ServiceAccount" && s.Name != "my-ctl" {
				t.Errorf("%s binds service account %q, want my-ctl", key, s.Name)
			}
		}
	}

	// Node groups: chosen by nodeSelector or by the label; carve-node
	// stays off the selector's nodes; per-group args and kubeletDir.
	g := pod(group)
	if g.NodeSelector["cloud.example.com/pool"] != "b" || g.NodeSelector["carve.dev/node-group"] != "" {
		t.Errorf("%s nodeSelector %v, want the group's own selector instead of the label", group, g.NodeSelector)
	}
	if l := pod(labelled); l.NodeSelector["carve.dev/node-group"] != "labelled" {
		t.Errorf("%s nodeSelector %v, want carve.dev/node-group=labelled", labelled, l.NodeSelector)
	}
	aff, _ := json.Marshal(pod(nodeDS).Affinity)
	if !strings.Contains(string(aff), `{"key":"cloud.example.com/pool","operator":"NotIn","values":["b"]}`) ||
		!strings.Contains(string(aff), `"carve.dev/node-group","operator":"DoesNotExist"`) {
		t.Errorf("carve-node's affinity %s does not keep off pool-b's nodes and labelled nodes", aff)
	}
	gc := container(t, g, "carve")
	if v, _ := flagValue(gc.Args, "--max-volumes"); v != "9" {
		t.Errorf("%s: per-group extraArgs missing: %q", group, gc.Args)
	}
	if v, _ := flagValue(gc.Args, "--kubelet-csi-socket"); v != "/var/lib/k0s/kubelet/plugins/lvm.carve.dev/csi.sock" {
		t.Errorf("%s: --kubelet-csi-socket=%q, want under the group's kubeletDir", group, v)
	}
	for _, v := range g.Volumes {
		if v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/var/lib/kubelet") {
			t.Errorf("%s: volume %s is %s, not under the group's kubeletDir", group, v.Name, v.HostPath.Path)
		}
	}
	if v, _ := flagValue(container(t, pod(labelled), "carve").Args, "--kubelet-csi-socket"); !strings.HasPrefix(v, "/var/lib/kubelet/") {
		t.Errorf("%s: --kubelet-csi-socket=%q, want the chart's kubeletDir", labelled, v)
	}
}

// TestServiceMonitorOptions: namespace, scrapeTimeout, relabelings and
// metricRelabelings reach the ServiceMonitor, after the chart's own node
// relabeling.
func TestServiceMonitorOptions(t *testing.T) {
	objs := renderChart(t, "--api-versions=monitoring.coreos.com/v1", "metrics.serviceMonitor.enabled=true",
		"metrics.serviceMonitor.namespace=monitoring", "metrics.serviceMonitor.scrapeTimeout=10s",
		"metrics.serviceMonitor.relabelings[0].targetLabel=cluster", "metrics.serviceMonitor.relabelings[0].replacement=prod",
		"metrics.serviceMonitor.metricRelabelings[0].action=drop", "metrics.serviceMonitor.metricRelabelings[0].regex=go_.*")
	sm, ok := byKey(t, objs)["ServiceMonitor monitoring/carve"]
	if !ok {
		t.Fatalf("no ServiceMonitor in namespace monitoring: %v", sortedKeys(byKey(t, objs)))
	}
	spec, _ := sm["spec"].(map[string]any)
	eps, _ := spec["endpoints"].([]any)
	if len(eps) != 1 {
		t.Fatalf("endpoints %v", eps)
	}
	ep, _ := eps[0].(map[string]any)
	if ep["scrapeTimeout"] != "10s" {
		t.Errorf("scrapeTimeout %v", ep["scrapeTimeout"])
	}
	rl, _ := ep["relabelings"].([]any)
	if len(rl) != 2 || !strings.Contains(mustJSON(t, rl[0]), "__meta_kubernetes_pod_node_name") || !strings.Contains(mustJSON(t, rl[1]), `"prod"`) {
		t.Errorf("relabelings %s, want the node label, then the user's", mustJSON(t, rl))
	}
	if mrl, _ := ep["metricRelabelings"].([]any); len(mrl) != 1 {
		t.Errorf("metricRelabelings %v", mrl)
	}
	nsSel, _ := spec["namespaceSelector"].(map[string]any)
	if !strings.Contains(mustJSON(t, nsSel), namespace) {
		t.Errorf("namespaceSelector %v does not select the release's namespace %s", nsSel, namespace)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHelmTestHook: `helm test` runs a pod whose claim must bind (the pod
// writes to the volume); both are test hooks, deleted when they pass, and
// not part of an install (nor of the kustomize base).
func TestHelmTestHook(t *testing.T) {
	objs, err := renderValues(t, "helmTest: {size: 100Mi}\n")
	if err != nil {
		t.Fatal(err)
	}
	m := byKey(t, objs)
	for _, key := range []string{"PersistentVolumeClaim carve-system/carve-test-claim", "Pod carve-system/carve-test-claim-binds"} {
		o, ok := m[key]
		if !ok {
			t.Fatalf("no %s among %v", key, sortedKeys(m))
		}
		md, _ := o["metadata"].(map[string]any)
		ann, _ := md["annotations"].(map[string]any)
		if ann["helm.sh/hook"] != "test" || !strings.Contains(ann["helm.sh/hook-delete-policy"].(string), "hook-succeeded") {
			t.Errorf("%s annotations %v, want a test hook deleted when it succeeds", key, ann)
		}
	}
	pvc := typed(t, m["PersistentVolumeClaim carve-system/carve-test-claim"]).(*corev1.PersistentVolumeClaim)
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != "carve-thick-ext4" || pvc.Spec.Resources.Requests.Storage().String() != "100Mi" {
		t.Errorf("test claim %+v, want the first StorageClass and helmTest.size", pvc.Spec)
	}
	p := typed(t, m["Pod carve-system/carve-test-claim-binds"]).(*corev1.Pod)
	if len(p.Spec.Volumes) != 1 || p.Spec.Volumes[0].PersistentVolumeClaim == nil || p.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != pvc.Name {
		t.Errorf("test pod volumes %+v, want the test claim", p.Spec.Volumes)
	}
	for _, o := range renderKustomize(t) {
		if strings.Contains(o.meta("name"), "carve-test") {
			t.Errorf("the kustomize base holds the helm test object %s", o.key())
		}
	}
}
