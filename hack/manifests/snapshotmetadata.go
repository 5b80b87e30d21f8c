package main

import (
	"bytes"
	"fmt"

	"sigs.k8s.io/yaml"
)

// snapshotMetadataDir is the external-snapshot-metadata sidecar's kustomize
// component, under the base's components/.
const snapshotMetadataDir = "components/snapshot-metadata"

// CAPlaceholder is the SnapshotMetadataService's spec.caCert in the
// component: not base64, so that the API server refuses the object until
// the user's overlay puts the CA there. test/deploy renders the chart with
// the same value.
const CAPlaceholder = "REPLACE-WITH-THE-BASE64-PEM-OF-THE-CA"

// generateSnapshotMetadata writes into dir the kustomize component of the
// chart's sidecars.snapshotMetadata.enabled=true: the objects of its
// template, and a patch of the controller Deployment that adds the
// sidecar's container and TLS volume as the chart renders them.
func generateSnapshotMetadata(helm, chart, dir string) error {
	const tmpl = "snapshot-metadata.yaml"
	on := []string{"--set", "sidecars.snapshotMetadata.enabled=true", "--set", "sidecars.snapshotMetadata.tls.caCert=" + CAPlaceholder}
	rendered, err := renderTemplate(helm, chart, tmpl, on...)
	if err != nil {
		return err
	}
	patch, err := sidecarPatch(helm, chart, on)
	if err != nil {
		return err
	}
	k := header + `# A kustomize component: the external-snapshot-metadata sidecar in the
# controller pods (the Kubernetes SnapshotMetadata API for backup
# applications, served from carve controller's CSI SnapshotMetadata
# service), its TLS Service, its SnapshotMetadataService object and RBAC;
# the same objects as the chart's sidecars.snapshotMetadata.enabled=true.
# NOT RUN against the real sidecar: it could not be built where carve is
# tested (docs/backup-restore.md, "Changed-block tracking"). It needs the
# SnapshotMetadataService CRD of the sidecar's release, a kubernetes.io/tls
# Secret carve-snapshot-metadata-tls whose certificate names
# carve-snapshot-metadata.carve-system, and the CA that signed it in the
# SnapshotMetadataService's spec.caCert (base64 of the PEM), which the API
# server refuses until a patch of your overlay replaces the placeholder:
#
#   resources: [<carve>/deploy/kubernetes]
#   components: [<carve>/deploy/kubernetes/components/snapshot-metadata]
#   patches:
#     - target: {kind: SnapshotMetadataService, name: lvm.carve.dev}
#       patch: |-
#         - {op: replace, path: /spec/caCert, value: <base64 of ca.crt>}
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
  - ` + tmpl + `
patches:
  - path: controller-patch.yaml
    target:
      kind: Deployment
      name: carve-controller
`
	return writeFiles(dir, map[string][]byte{tmpl: rendered, "controller-patch.yaml": append([]byte(header), patch...), "kustomization.yaml": []byte(k)})
}

// sidecarPatch is a JSON patch of the controller Deployment that adds what
// the chart with the values on adds to it: the container and the volume its
// default rendering lacks, by name, at the end.
func sidecarPatch(helm, chart string, on []string) ([]byte, error) {
	pod := func(args ...string) (map[string]any, error) {
		out, err := template(helm, chart, append(args, "--show-only", "templates/controller.yaml")...)
		if err != nil {
			return nil, err
		}
		files, err := split(out)
		if err != nil {
			return nil, err
		}
		for _, doc := range splitDocs(files["controller.yaml"]) {
			var o map[string]any
			if err := yaml.Unmarshal(doc, &o); err != nil {
				return nil, err
			}
			if o["kind"] == "Deployment" {
				spec, _ := o["spec"].(map[string]any)
				tmpl, _ := spec["template"].(map[string]any)
				p, _ := tmpl["spec"].(map[string]any)
				return p, nil
			}
		}
		return nil, fmt.Errorf("templates/controller.yaml rendered no Deployment")
	}
	with, err := pod(on...)
	if err != nil {
		return nil, err
	}
	without, err := pod()
	if err != nil {
		return nil, err
	}
	added := func(key string) []any {
		names := map[any]bool{}
		old, _ := without[key].([]any)
		for _, c := range old {
			names[c.(map[string]any)["name"]] = true
		}
		var out []any
		now, _ := with[key].([]any)
		for _, c := range now {
			if !names[c.(map[string]any)["name"]] {
				out = append(out, c)
			}
		}
		return out
	}
	containers, volumes := added("containers"), added("volumes")
	if len(containers) != 1 || len(volumes) != 1 {
		return nil, fmt.Errorf("the chart with %v adds %d containers and %d volumes to the controller pod, want 1 and 1", on, len(containers), len(volumes))
	}
	// A JSON patch appends, as the chart does; a strategic merge would put
	// them first.
	return yaml.Marshal([]any{
		map[string]any{"op": "add", "path": "/spec/template/spec/containers/-", "value": containers[0]},
		map[string]any{"op": "add", "path": "/spec/template/spec/volumes/-", "value": volumes[0]},
	})
}

// splitDocs cuts a YAML stream into its documents.
func splitDocs(b []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(b, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			out = append(out, d)
		}
	}
	return out
}
