// Package channel is the node's end of the node channel: what `carve node`
// serves to the controller on --node-channel-address beside the CSI
// Controller service. The agent's ECDSA key never leaves its memory; it
// presents a self-signed certificate until the controller, having checked
// the node's token (Enroll), installs one carve's CA signed
// (InstallCertificate). It streams capacity (WatchCapacity) and lists
// carve's LVs (Inventory) from the volume-group view. Its handlers return
// gRPC statuses.
package channel
