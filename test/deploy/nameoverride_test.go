//go:build deploytest

package deploy

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestNameOverride: with nameOverride or fullnameOverride every object the
// chart names after carve takes the override as its prefix, and every name
// one object gives another resolves within the rendering: pods' service
// accounts and ConfigMaps, RBAC subjects and roles, the Roles'
// resourceNames, carve controller's flags naming the node agents' Service,
// their service account and the node channel's CA, the ServiceMonitor's
// jobs, selectors of Services, PodDisruptionBudgets and NetworkPolicies.
// Only names users choose themselves (StorageClasses,
// VolumeSnapshotClasses) and the driver's (lvm.carve.dev, the CRDs) keep
// theirs. Without an override the rendering is the kustomize base
// (TestManifestsGenerated).
func TestNameOverride(t *testing.T) {
	// Everything that renders objects with names: node groups, the
	// snapshot-controller, the monitoring objects, the NetworkPolicy, a
	// PodDisruptionBudget, the CRDs and snapshot classes, the helm test.
	all := []string{"--api-versions=monitoring.coreos.com/v1", "--api-versions=snapshot.storage.k8s.io/v1",
		"nodeGroups[0].name=nvme", "nodeGroups[0].deviceClasses[0].name=fast", "nodeGroups[0].deviceClasses[0].volumeGroup=nvme",
		"snapshotController.enabled=true", "metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
		"dashboard.enabled=true", "networkPolicy.enabled=true", "crds.install=true", "controller.replicas=2"}
	for _, tc := range []struct {
		name   string
		set    []string
		prefix string
		// chosen: names the user gave, which keep theirs.
		chosen []string
	}{
		{"nameOverride", []string{"nameOverride=store"}, "store", nil},
		{"fullnameOverride", []string{"fullnameOverride=team-lvm", "nameOverride=ignored"}, "team-lvm", nil},
		{"service accounts named", []string{"nameOverride=store", "node.serviceAccount.name=agents", "controller.serviceAccount.name=ctl"}, "store", []string{"agents", "ctl"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderChartWithTests(t, append(slices.Clone(all), tc.set...)...)
			checkNames(t, objs, tc.prefix, tc.chosen...)
		})
	}
	// The control: the default rendering passes the same checks with
	// the prefix carve.
	t.Run("none", func(t *testing.T) { checkNames(t, renderChartWithTests(t, all...), "carve") })
}

// renderChartWithTests is renderChart with the helm test hook's objects.
func renderChartWithTests(t *testing.T, set ...string) []object {
	t.Helper()
	objs := renderChart(t, set...)
	root := repoRoot(t)
	argv := []string{tool(t, "helm"), "template", "carve", root + "/deploy/helm/carve", "--namespace", namespace, "--kube-version", kubeVersion, "--show-only", "templates/tests/claim-binds.yaml"}
	for _, s := range set {
		if strings.HasPrefix(s, "--") {
			argv = append(argv, s)
		} else {
			argv = append(argv, "--set", s)
		}
	}
	return append(objs, decodeObjects(t, run(t, root, argv...))...)
}

// keepTheirNames are the objects whose names do not follow the prefix.
var keepTheirNames = map[string]bool{"CSIDriver": true, "StorageClass": true, "VolumeSnapshotClass": true, "CustomResourceDefinition": true}

// referring are the kinds whose objects name others.
var referring = map[string]bool{"DaemonSet": true, "Deployment": true, "Pod": true, "RoleBinding": true, "ClusterRoleBinding": true,
	"Role": true, "Service": true, "PodDisruptionBudget": true, "NetworkPolicy": true}

func checkNames(t *testing.T, objs []object, prefix string, chosen ...string) {
	t.Helper()
	have := map[string]bool{} // kind/namespace/name
	name := func(kind, ns, n string) string { return kind + "/" + ns + "/" + n }
	var pods []struct {
		what string
		ns   string
		spec corev1.PodTemplateSpec
	}
	for _, o := range objs {
		have[name(o.kind(), o.meta("namespace"), o.meta("name"))] = true
		if slices.Contains(chosen, o.meta("name")) {
			continue
		}
		if !keepTheirNames[o.kind()] && o.meta("name") != prefix && !strings.HasPrefix(o.meta("name"), prefix+"-") {
			t.Errorf("%s is not named after %s", o.key(), prefix)
		}
		if prefix != "carve" && strings.HasPrefix(o.meta("name"), "carve") && !keepTheirNames[o.kind()] {
			t.Errorf("%s keeps carve's name", o.key())
		}
	}
	need := func(what, kind, ns, n string) {
		t.Helper()
		if !have[name(kind, ns, n)] {
			t.Errorf("%s names %s %s/%s, which the rendering does not hold", what, kind, ns, n)
		}
	}
	// selects: the pods of some DaemonSet or Deployment in ns match sel.
	selects := func(what, ns string, sel labels.Selector) {
		t.Helper()
		for _, o := range objs {
			if o.meta("namespace") != ns || (o.kind() != "DaemonSet" && o.kind() != "Deployment") {
				continue
			}
			var podLabels map[string]string
			switch p := typed(t, o).(type) {
			case *appsv1.DaemonSet:
				podLabels = p.Spec.Template.Labels
			case *appsv1.Deployment:
				podLabels = p.Spec.Template.Labels
			default:
				continue
			}
			if sel.Matches(labels.Set(podLabels)) {
				return
			}
		}
		t.Errorf("%s selects no pods in %s (%s)", what, ns, sel)
	}
	flags := map[string]string{}
	var nodeSA []string
	for _, o := range objs {
		if !referring[o.kind()] {
			continue
		}
		switch x := typed(t, o).(type) {
		case *appsv1.DaemonSet:
			pods = append(pods, struct {
				what string
				ns   string
				spec corev1.PodTemplateSpec
			}{o.key(), o.meta("namespace"), x.Spec.Template})
			nodeSA = append(nodeSA, x.Spec.Template.Spec.ServiceAccountName)
		case *appsv1.Deployment:
			pods = append(pods, struct {
				what string
				ns   string
				spec corev1.PodTemplateSpec
			}{o.key(), o.meta("namespace"), x.Spec.Template})
			for _, c := range x.Spec.Template.Spec.Containers {
				if c.Name != "carve" {
					continue
				}
				for _, a := range c.Args {
					if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--node-") {
						flags[k] = v
					}
				}
			}
		case *corev1.Pod:
			pods = append(pods, struct {
				what string
				ns   string
				spec corev1.PodTemplateSpec
			}{o.key(), o.meta("namespace"), corev1.PodTemplateSpec{Spec: x.Spec}})
		case *rbacv1.RoleBinding:
			checkBinding(t, o.key(), x.Subjects, x.RoleRef, o.meta("namespace"), need)
		case *rbacv1.ClusterRoleBinding:
			checkBinding(t, o.key(), x.Subjects, x.RoleRef, "", need)
		case *rbacv1.Role:
			for _, r := range x.Rules {
				for _, res := range r.Resources {
					if res != "configmaps" && res != "secrets" {
						continue
					}
					for _, n := range r.ResourceNames {
						if ca, kek := prefix+"-node-channel-ca", prefix+"-volume-kek"; n != ca && (res != "secrets" || n != kek) {
							t.Errorf("%s grants %s %q, want the node channel's CA %s or the volume keys' Secret %s", o.key(), res, n, ca, kek)
						}
					}
				}
			}
		case *corev1.Service:
			if len(x.Spec.Selector) > 0 {
				selects(o.key(), o.meta("namespace"), labels.SelectorFromSet(x.Spec.Selector))
			}
		case *policyv1.PodDisruptionBudget:
			sel, err := metav1.LabelSelectorAsSelector(x.Spec.Selector)
			if err != nil {
				t.Fatal(err)
			}
			selects(o.key(), o.meta("namespace"), sel)
		case *networkingv1.NetworkPolicy:
			sel, err := metav1.LabelSelectorAsSelector(&x.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			selects(o.key(), o.meta("namespace"), sel)
		}
	}
	for _, p := range pods {
		if sa := p.spec.Spec.ServiceAccountName; sa != "" {
			need(p.what+" (serviceAccountName)", "ServiceAccount", p.ns, sa)
		}
		for _, v := range p.spec.Spec.Volumes {
			var cms []*corev1.ConfigMapProjection
			if v.ConfigMap != nil {
				cms = append(cms, &corev1.ConfigMapProjection{LocalObjectReference: v.ConfigMap.LocalObjectReference, Optional: v.ConfigMap.Optional})
			}
			if v.Projected != nil {
				for _, s := range v.Projected.Sources {
					if s.ConfigMap != nil {
						cms = append(cms, s.ConfigMap)
					}
				}
			}
			for _, cm := range cms {
				if cm.Optional != nil && *cm.Optional {
					// Made by carve controller at run time: the CA's.
					if want := prefix + "-node-channel-ca"; cm.Name != want {
						t.Errorf("%s mounts the ConfigMap %s, carve controller publishes the CA as %s", p.what, cm.Name, want)
					}
					continue
				}
				need(p.what+" (volume "+v.Name+")", "ConfigMap", p.ns, cm.Name)
			}
			if v.PersistentVolumeClaim != nil {
				need(p.what+" (volume "+v.Name+")", "PersistentVolumeClaim", p.ns, v.PersistentVolumeClaim.ClaimName)
			}
		}
	}

	// carve controller's flags, or their defaults (cmd/carve/route.go).
	flag := func(k, def string) string {
		if v, ok := flags[k]; ok {
			return v
		}
		return def
	}
	svc := flag("--node-channel-service", "carve-node")
	need("--node-channel-service", "Service", namespace, svc)
	if svc != prefix+"-node" {
		t.Errorf("--node-channel-service=%s, want %s-node", svc, prefix)
	}
	if ca := flag("--node-channel-ca", "carve-node-channel-ca"); ca != prefix+"-node-channel-ca" {
		t.Errorf("carve controller's node channel CA is %s, want %s-node-channel-ca", ca, prefix)
	}
	sa := flag("--node-service-account", "carve-node")
	need("--node-service-account", "ServiceAccount", namespace, sa)
	for _, got := range nodeSA {
		if got != sa {
			t.Errorf("a node DaemonSet runs as %s, carve controller accepts agents of %s only", got, sa)
		}
	}

	// The ServiceMonitor names every job carve-* (the dashboard's and
	// the rules' jobs), whatever the Services are called.
	for _, o := range objs {
		if o.kind() != "ServiceMonitor" {
			continue
		}
		js := mustJSON(t, o["spec"])
		for _, svc := range objs {
			if svc.kind() != "Service" {
				continue
			}
			if job := jobOf(js, prefix, svc.meta("name")); !strings.HasPrefix(job, "carve-") {
				t.Errorf("the ServiceMonitor gives the Service %s the job %q, want carve-*", svc.meta("name"), job)
			}
		}
	}
}

// jobOf applies the ServiceMonitor's job relabeling, if any, to a
// Service name.
func jobOf(spec, prefix, service string) string {
	m := regexp.MustCompile(`"regex":"([^"]*)","replacement":"carve-\$1","sourceLabels":\["__meta_kubernetes_service_name"\],"targetLabel":"job"`).FindStringSubmatch(spec)
	if m == nil {
		return service
	}
	re := regexp.MustCompile("^(?:" + strings.ReplaceAll(m[1], `\\`, `\`) + ")$")
	if re.MatchString(service) {
		return re.ReplaceAllString(service, "carve-$1")
	}
	return service
}

func checkBinding(t *testing.T, what string, subjects []rbacv1.Subject, ref rbacv1.RoleRef, ns string, need func(what, kind, ns, n string)) {
	t.Helper()
	for _, s := range subjects {
		if s.Kind == "ServiceAccount" {
			need(what+" (subject)", "ServiceAccount", s.Namespace, s.Name)
		}
	}
	need(what+" (roleRef)", ref.Kind, ns, ref.Name)
}
