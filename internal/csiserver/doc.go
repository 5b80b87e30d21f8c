// Package csiserver is what both of carve's CSI servers share: the gRPC
// server and its interceptors, the unix socket, the Identity service, and
// the capability lists.
package csiserver
