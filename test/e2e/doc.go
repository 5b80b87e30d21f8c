// Package e2e holds carve's end-to-end tier (build tag e2e): WaitForFirstConsumer
// placement, capacity tracking, rescheduling on exhaustion and deletion,
// against a real etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager and csi-provisioner with simulated nodes (see
// package cluster). Run it with `make test-e2e` as root.
package e2e
