// Package topology holds carve's topology key: a volume's segment is exactly
// {topology.carve.dev/node: <node>}.
package topology

// Key is the topology key; its value is the Kubernetes node name.
const Key = "topology.carve.dev/node"

// Segments is node's segment.
func Segments(node string) map[string]string {
	return map[string]string{Key: node}
}

// NodeOf is the node a segment names; "" when it has other keys too.
func NodeOf(segments map[string]string) string {
	if len(segments) != 1 {
		return ""
	}
	return segments[Key]
}
