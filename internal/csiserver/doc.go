// Package csiserver is what both of carve's CSI servers share: the gRPC
// server with its logging and metrics interceptors, the unix socket it
// listens on, the Identity service, and the capability lists and answers.
// The node agent serves its Controller and Node services on it, carve
// controller its router.
package csiserver
