// Package cluster runs carve's end-to-end test bed as plain processes on
// 127.0.0.1: etcd, kube-apiserver, kube-scheduler and
// kube-controller-manager built from source, and simulated nodes that each
// own a volume group on loop devices (LVM activation disabled), a `carve
// plugin` process and a csi-provisioner process started with the flags of
// carve's own DaemonSet. No kubelet runs: pods are scheduled and bound, their
// containers never start.
//
// It is plain Go (no testing dependency) so that the e2e tests and the demo
// program share it. Everything it starts runs with a deadline and is stopped
// by its own process id.
package cluster
