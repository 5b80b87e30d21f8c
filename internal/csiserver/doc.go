// Package csiserver is what both CSI servers share: gRPC server, interceptors, socket,
// Identity and capabilities.
package csiserver
