// Package topology holds carve's topology key. Every carve volume lives on
// one node, so its segment is exactly {topology.carve.dev/node: <node
// name>}: Segments makes it, NodeOf reads it.
package topology

// Key is the topology key; its value is the Kubernetes node name.
const Key = "topology.carve.dev/node"

// Segments is node's segment.
func Segments(node string) map[string]string {
	return map[string]string{Key: node}
}

// NodeOf is the node a segment names, or "" when it is not a carve
// segment: a segment with other keys as well is not carve's.
func NodeOf(segments map[string]string) string {
	if len(segments) != 1 {
		return ""
	}
	return segments[Key]
}
