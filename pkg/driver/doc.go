// Package driver holds carve's CSI servers (Identity, Controller, Node) and
// their gRPC interceptors. The servers reach LVM and mounts only through the
// narrow interfaces defined here, so each RPC is unit-tested with fakes.
package driver
