// Package podfit tells whether a pod could run on a node by kube-scheduler's
// own filters (k8s.io/component-helpers): selector and required affinity,
// taints and the cordon, and allocatable resources less bound pods'
// requests. Each check answers "" or a sentence for an Event.
package podfit

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// unschedulable is the taint the scheduler treats a cordoned node as having;
// a pod tolerating it may still go there.
var unschedulable = corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}

// Why is "" when pod may run on node by its selector, required affinity and
// tolerations; else the constraint (the caller names the node).
func Why(pod *corev1.Pod, node *corev1.Node) string {
	if len(pod.Spec.NodeSelector) > 0 {
		ok, err := nodeaffinity.NewRequiredNodeAffinity(pod.Spec.NodeSelector, nil).Match(node)
		if err != nil || !ok {
			return fmt.Sprintf("its nodeSelector %s does not match the node's labels", selector(pod.Spec.NodeSelector))
		}
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		ok, err := nodeaffinity.NewRequiredNodeAffinity(nil, a).Match(node)
		if err != nil {
			return fmt.Sprintf("its required node affinity is not valid: %v", err)
		}
		if !ok {
			return "its required node affinity (requiredDuringSchedulingIgnoredDuringExecution) does not match the node"
		}
	}
	if node.Spec.Unschedulable && !corev1helpers.TolerationsTolerateTaint(klog.Background(), pod.Spec.Tolerations, &unschedulable, false) {
		return "the node is cordoned (unschedulable) and the pod does not tolerate " + unschedulable.ToString()
	}
	taint, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, pod.Spec.Tolerations,
		func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, false)
	if untolerated {
		return "it does not tolerate the node's taint " + taint.ToString()
	}
	return ""
}

// Room is "" when the node's allocatable, less the requests of bound (pods
// of other nodes and among pods are skipped), holds pods together; else the
// short resource.
func Room(node *corev1.Node, bound []corev1.Pod, pods ...*corev1.Pod) string {
	want := corev1.ResourceList{}
	skip := map[string]bool{}
	for _, p := range pods {
		add(want, resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}))
		skip[p.Namespace+"/"+p.Name] = true
	}
	used := corev1.ResourceList{}
	count := int64(len(pods))
	for i := range bound {
		p := &bound[i]
		if p.Spec.NodeName != node.Name || skip[p.Namespace+"/"+p.Name] ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		add(used, resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}))
		count++
	}
	if most, ok := node.Status.Allocatable[corev1.ResourcePods]; ok && count > most.Value() {
		return fmt.Sprintf("the node runs %d pods already, its most (allocatable pods: %s)", count-int64(len(pods)), most.String())
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, string(n))
	}
	slices.Sort(names)
	for _, n := range names {
		name := corev1.ResourceName(n)
		q := want[name]
		if q.IsZero() {
			continue
		}
		free := node.Status.Allocatable[name].DeepCopy()
		free.Sub(used[name])
		if free.Cmp(q) < 0 {
			alloc := node.Status.Allocatable[name]
			return fmt.Sprintf("insufficient %s: the pod requests %s, the node has %s allocatable of which %s is requested by its pods",
				n, q.String(), alloc.String(), orZero(used[name]))
		}
	}
	return ""
}

func add(to, l corev1.ResourceList) {
	for n, q := range l {
		sum := to[n].DeepCopy()
		sum.Add(q)
		to[n] = sum
	}
}

func orZero(q resource.Quantity) string {
	if q.IsZero() {
		return "0"
	}
	return q.String()
}

func selector(s map[string]string) string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + s[k]
	}
	return strings.Join(keys, ",")
}
