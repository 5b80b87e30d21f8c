// Package pinned reads the node a PersistentVolume is pinned to. It is
// apart from package topology so that the node agent's binary, which
// imports topology but reads no PersistentVolume, links no Kubernetes API
// types for it.
package pinned

import corev1 "k8s.io/api/core/v1"

// Node is the node a PersistentVolume's required node affinity pins
// it to on key (carve's is topology.Key): csi-provisioner writes the segment
// CreateVolume returned as a term with one In expression of one value.
// "" when no term names a single node on key.
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
