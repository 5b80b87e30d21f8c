// Package channel is the node's end of the node channel: what
// `carve node` serves to carve's controller on --node-channel-address,
// beside the CSI Controller service for its own volume groups.
//
// The agent holds an ECDSA key that never leaves its memory. It presents a
// self-signed certificate for it until the controller, having checked the
// node's projected service-account token (Enroll), installs the
// certificate carve's CA signed for this node (InstallCertificate); from
// the next handshake on it presents that one. Its listener completes a
// handshake only with a client presenting carve://controller from a
// trusted CA (ServerTLS). It streams the node's capacity per device class
// on every change (WatchCapacity) and lists carve's LVs (Inventory), both
// from the volume-group view that GetCapacity reads.
//
// The package is an edge of gRPC: its handlers return gRPC statuses.
package channel
