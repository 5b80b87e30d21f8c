// Package cluster runs carve's end-to-end test bed as plain processes:
// etcd, kube-apiserver, kube-scheduler and kube-controller-manager built
// from source on 127.0.0.1; simulated nodes that each own a volume group
// on loop devices (LVM activation disabled) and a `carve node` process
// (the node agent) started with the flags of carve's own DaemonSet, its
// node channel on the host's IPv4 address; and the controller Deployment's
// containers (carve controller, csi-provisioner, csi-snapshotter,
// csi-resizer) as processes with the Deployment's flags. No kubelet runs:
// pods are scheduled and bound, their containers never start, and the
// harness does the kubelet's and the EndpointSlice controller's part for
// the node channel (tokens, the CA file, EndpointSlices).
//
// It is plain Go (no testing dependency) so that the e2e tests and the demo
// program share it. Everything it starts runs with a deadline and is stopped
// by its own process id.
package cluster
