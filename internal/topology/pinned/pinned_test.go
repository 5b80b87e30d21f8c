package pinned

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/carve-csi/carve/internal/topology"
)

func TestPinnedNode(t *testing.T) {
	pv := func(terms ...corev1.NodeSelectorTerm) *corev1.PersistentVolume {
		p := &corev1.PersistentVolume{}
		if terms != nil {
			p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}
		}
		return p
	}
	expr := func(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}
	}
	tests := []struct {
		name string
		pv   *corev1.PersistentVolume
		want string
	}{
		{"as csi-provisioner writes it", pv(expr(topology.Key, corev1.NodeSelectorOpIn, "node-a")), "node-a"},
		{"no node affinity", pv(), ""},
		{"another key", pv(expr("topology.other.dev/node", corev1.NodeSelectorOpIn, "node-a")), ""},
		{"two nodes: not pinned to one", pv(expr(topology.Key, corev1.NodeSelectorOpIn, "node-a", "node-b")), ""},
		{"NotIn", pv(expr(topology.Key, corev1.NodeSelectorOpNotIn, "node-a")), ""},
		{"the second term", pv(expr("zone", corev1.NodeSelectorOpIn, "z1"), expr(topology.Key, corev1.NodeSelectorOpIn, "node-b")), "node-b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Node(tc.pv, topology.Key); got != tc.want {
				t.Errorf("Node = %q, want %q", got, tc.want)
			}
		})
	}
}
