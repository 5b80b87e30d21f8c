// Package driver holds carve's CSI servers (Identity, Controller, Node) and
// their interceptors: the CSI edge. The Controller maps requests to
// internal/node/provision; errors become gRPC codes in errors.go only.
package driver
