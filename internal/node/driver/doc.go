// Package driver holds carve's CSI servers (Identity, Controller, Node) and
// their gRPC interceptors: the CSI edge. The Controller server checks
// requests and maps them to internal/node/provision, which holds the volume
// lifecycle; errors become gRPC codes in errors.go only. The servers reach
// LVM and mounts only through narrow interfaces, so each RPC is unit-tested
// with fakes.
package driver
