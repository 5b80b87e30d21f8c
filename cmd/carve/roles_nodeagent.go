//go:build nodeagent

package main

// program is the binary's name in usage: carve-node, the node agent's
// binary, which links no Kubernetes client.
const program = "carve-node"

// controllerRole is absent from carve-node: the controller needs the
// Kubernetes API, and its client would cost the node agent on every node
// the resident memory of its mapped code (docs/benchmarks.md).
func controllerRole() role {
	return role{absent: "not in carve-node, the node agent's binary, which links no Kubernetes client: run `carve controller` from the carve binary (/usr/local/bin/carve in the image)"}
}
