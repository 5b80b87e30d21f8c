//go:build nodeagent

package main

const program = "carve-node"

// controllerRole is absent from carve-node: the Kubernetes client would
// cost every node agent its mapped code's memory (docs/benchmarks.md).
func controllerRole() role {
	return role{absent: "not in carve-node, the node agent's binary, which links no Kubernetes client: run `carve controller` from the carve binary (/usr/local/bin/carve in the image)"}
}
