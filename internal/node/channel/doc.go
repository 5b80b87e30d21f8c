// Package channel is the node's end of the node channel, served to the
// controller on --node-channel-address. The agent's ECDSA key never leaves
// memory; it presents a self-signed certificate until the controller, having
// checked the node's token (Enroll), installs one signed by carve's CA.
// Handlers return gRPC statuses.
package channel
