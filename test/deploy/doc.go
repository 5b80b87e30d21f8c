//go:build deploytest

// Package deploy checks what users install: the kustomize base and the Helm
// chart (valid objects, least-privilege RBAC, the sidecar flags carve's
// design fixes, the base being the chart rendered by `make manifests`), the Dockerfile
// (every program carve runs comes from a package it installs), and the
// Grafana dashboard and alert rules (every metric they use is one a running
// `carve node` exports). It needs root for the plugin on a loop-device
// volume group, and helm and kustomize in $CARVE_CACHE/bin (make
// test-deploy installs both from the Go module proxy).
package deploy
