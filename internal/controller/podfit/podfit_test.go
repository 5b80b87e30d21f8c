package podfit

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node(mod func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
		"kubernetes.io/hostname": "node-a", "zone": "z1", "gpu": "none"}}}
	n.Status.Allocatable = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods: resource.MustParse("3")}
	if mod != nil {
		mod(n)
	}
	return n
}

func pod(name string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	p.Spec.Containers = []corev1.Container{{Name: "app"}}
	if mod != nil {
		mod(p)
	}
	return p
}

func requests(cpu, mem string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}
	}
}

func TestWhy(t *testing.T) {
	required := func(op corev1.NodeSelectorOperator, key string, values ...string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}}}}}
		}
	}
	taint := func(effect corev1.TaintEffect) func(*corev1.Node) {
		return func(n *corev1.Node) {
			n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "db", Effect: effect}}
		}
	}
	tolerate := func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "db"}}
	}
	for _, c := range []struct {
		name string
		pod  func(*corev1.Pod)
		node func(*corev1.Node)
		want string // a part of the answer; "" fits
	}{
		{"no constraint", nil, nil, ""},
		{"nodeSelector matches", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"zone": "z1"} }, nil, ""},
		{"nodeSelector excludes", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"zone": "z2", "gpu": "none"} },
			nil, "its nodeSelector gpu=none,zone=z2 does not match"},
		{"required affinity matches", required(corev1.NodeSelectorOpIn, "zone", "z1", "z3"), nil, ""},
		{"required affinity excludes", required(corev1.NodeSelectorOpNotIn, "zone", "z1"), nil, "its required node affinity"},
		{"preferred affinity only", func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
				Weight: 1, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z9"}}}}}}}}
		}, nil, ""},
		{"NoSchedule taint", nil, taint(corev1.TaintEffectNoSchedule), "does not tolerate the node's taint dedicated=db:NoSchedule"},
		{"NoExecute taint", nil, taint(corev1.TaintEffectNoExecute), "dedicated=db:NoExecute"},
		{"PreferNoSchedule taint", nil, taint(corev1.TaintEffectPreferNoSchedule), ""},
		{"tolerated taint", tolerate, taint(corev1.TaintEffectNoSchedule), ""},
		{"cordoned", nil, func(n *corev1.Node) { n.Spec.Unschedulable = true }, "cordoned"},
		{"cordoned, tolerated", func(p *corev1.Pod) {
			p.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists}}
		}, func(n *corev1.Node) { n.Spec.Unschedulable = true }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Why(pod("p", c.pod), node(c.node))
			if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
				t.Errorf("Why = %q, want %q", got, c.want)
			}
		})
	}
}

func TestRoom(t *testing.T) {
	bound := func(name, node string, phase corev1.PodPhase, cpu, mem string) corev1.Pod {
		p := pod(name, requests(cpu, mem))
		p.Spec.NodeName, p.Status.Phase = node, phase
		return *p
	}
	for _, c := range []struct {
		name  string
		bound []corev1.Pod
		pods  []*corev1.Pod
		want  string
	}{
		{"empty node", nil, []*corev1.Pod{pod("p", requests("4", "8Gi"))}, ""},
		{"no requests", []corev1.Pod{bound("b", "node-a", corev1.PodRunning, "4", "8Gi")}, []*corev1.Pod{pod("p", nil)}, ""},
		{"cpu short", []corev1.Pod{bound("b", "node-a", corev1.PodRunning, "3500m", "1Gi")}, []*corev1.Pod{pod("p", requests("1", "1Gi"))},
			"insufficient cpu: the pod requests 1, the node has 4 allocatable of which 3500m is requested"},
		{"memory short, two pods", nil, []*corev1.Pod{pod("p", requests("1", "5Gi")), pod("q", requests("1", "4Gi"))}, "insufficient memory"},
		{"ended and other nodes' pods do not count", []corev1.Pod{
			bound("done", "node-a", corev1.PodSucceeded, "4", "8Gi"), bound("failed", "node-a", corev1.PodFailed, "4", "8Gi"),
			bound("elsewhere", "node-b", corev1.PodRunning, "4", "8Gi")}, []*corev1.Pod{pod("p", requests("4", "8Gi"))}, ""},
		{"the pod itself, listed as bound, counts once", []corev1.Pod{bound("p", "node-a", corev1.PodPending, "4", "8Gi")},
			[]*corev1.Pod{pod("p", requests("4", "8Gi"))}, ""},
		{"extended resource the node lacks", nil, []*corev1.Pod{pod("p", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		})}, "insufficient nvidia.com/gpu"},
		{"pods full", []corev1.Pod{bound("b", "node-a", corev1.PodRunning, "0", "0"), bound("c", "node-a", corev1.PodRunning, "0", "0"),
			bound("d", "node-a", corev1.PodRunning, "0", "0")}, []*corev1.Pod{pod("p", nil)}, "runs 3 pods already"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Room(node(nil), c.bound, c.pods...)
			if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
				t.Errorf("Room = %q, want %q", got, c.want)
			}
		})
	}
}
