// Package e2e holds carve's end-to-end tier (build tag e2e): WaitForFirstConsumer
// placement, capacity tracking, rescheduling on exhaustion and deletion,
// against a real etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager, the controller Deployment's carve controller and
// CSI sidecars, and simulated nodes' node agents reached over the node
// channel (see package cluster). Run it with `make test-e2e` as root.
package e2e
