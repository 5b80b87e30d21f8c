// Package agents is the controller's side of the node channel
// (docs/architecture.md, "The node channel"): it finds the node agents via
// their headless Service's EndpointSlices, proves who each one is, and keeps
// one verified gRPC connection per node for the router's calls and the
// capacity streams.
//
// Enrollment dials an agent once without verifying its certificate, calls
// Enroll and checks the returned token with a TokenReview (the agents'
// service account, bound to the endpoint's pod, naming its node); only then
// is its certificate signed, and later connections require
// carve://node/<node> from carve's CA. Nothing secret travels on that first
// connection; the token, audience the controller, proves the node where TLS
// could not. The node-name claim is Kubernetes' pod-bound token extra;
// without the ServiceAccountTokenPodNodeInfo gate (before v1.32) every
// enrollment is refused: the safe failure.
package agents
