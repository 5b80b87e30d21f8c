// Package agents is the controller's side of the node channel
// (docs/architecture.md, "The node channel"): it finds the agents via their
// headless Service's EndpointSlices, proves who each is, and keeps one
// verified gRPC connection per node. Enrollment dials once without
// verifying, calls Enroll and checks the returned token with a TokenReview
// (service account, bound pod, node name); only then is the agent's
// certificate signed, and later connections require carve://node/<node>.
// Nothing secret travels unverified. Without ServiceAccountTokenPodNodeInfo
// (before v1.32) every enrollment is refused: the safe failure.
package agents
