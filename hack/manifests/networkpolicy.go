package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// networkPolicyDir is the NetworkPolicy's kustomize component, under the
// base's components/.
const networkPolicyDir = "components/node-channel-network-policy"

// generateNetworkPolicy writes the kustomize component of the chart's
// NetworkPolicy (networkPolicy.enabled=true) into dir: the objects and a
// Component kustomization.yaml naming them.
func generateNetworkPolicy(helm, chart, dir string) error {
	const tmpl = "network-policy.yaml"
	rendered, err := template(helm, chart, "--set", "networkPolicy.enabled=true", "--show-only", "templates/"+tmpl)
	if err != nil {
		return err
	}
	files, err := split(rendered)
	if err != nil {
		return err
	}
	if len(files) != 1 || files[tmpl] == nil {
		return fmt.Errorf("the chart's %s rendered %d files, want itself", tmpl, len(files))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, tmpl), files[tmpl], 0o644); err != nil {
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
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}
