package main

// networkPolicyDir is the NetworkPolicy's kustomize component, under the
// base's components/.
const networkPolicyDir = "components/node-channel-network-policy"

// generateNetworkPolicy writes the kustomize component of the chart's
// NetworkPolicy (networkPolicy.enabled=true) into dir: the objects and a
// Component kustomization.yaml naming them.
func generateNetworkPolicy(helm, chart, dir string) error {
	const tmpl = "network-policy.yaml"
	rendered, err := renderTemplate(helm, chart, tmpl, "--set", "networkPolicy.enabled=true")
	if err != nil {
		return err
	}
	k := header + `# A kustomize component: a NetworkPolicy that admits to the node pods'
# node channel port only the controller pods, and to their metrics port
# only the namespace "monitoring" (patch the policy's last "from" for
# another); the same object as the chart's networkPolicy.enabled=true. Use
# it where the network plugin enforces NetworkPolicies, in your own
# kustomization beside the base:
#
#   resources: [<carve>/deploy/kubernetes]
#   components: [<carve>/deploy/kubernetes/components/node-channel-network-policy]
#
# docs/install.md, "Pod security and network policy".
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
  - ` + tmpl + "\n"
	return writeFiles(dir, map[string][]byte{tmpl: rendered, "kustomization.yaml": []byte(k)})
}
