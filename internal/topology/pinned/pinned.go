// Package pinned reads a PV's node; apart from topology so the node agent links no
// Kubernetes API types.
package pinned

import corev1 "k8s.io/api/core/v1"

// Node is the node pv's required affinity pins it to on key (one In term of one
// value, as csi-provisioner writes it); "" when none.
func Node(pv *corev1.PersistentVolume, key string) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == key && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}
