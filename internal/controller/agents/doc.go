// Package agents is the carve controller's side of the node channel
// (docs/architecture.md, "The node channel"): it finds the node agents
// through the EndpointSlices of their headless Service, proves who each one
// is, and keeps one verified gRPC connection per node, over which the router
// sends CSI Controller calls and the nodes' capacity streams are read.
//
// Enrollment dials an agent once without verifying its server certificate,
// calls Enroll and checks the returned service-account token with a
// TokenReview (the agents' service account, bound to the endpoint's pod,
// naming the endpoint's node); only then is the agent's certificate request
// signed, and every later connection requires carve://node/<node> from
// carve's CA. That first connection is safe because nothing secret goes to
// the agent on it: the controller's certificate and the signed one are
// public, and the token, whose audience is the controller, proves the node
// where a TLS certificate could not.
//
// The node-name claim rests on Kubernetes' pod-bound tokens (checked in the
// v1.36.1 source: pkg/registry/core/serviceaccount/storage/token.go,
// pkg/serviceaccount/claims.go, and k8s.io/apiserver
// pkg/authentication/serviceaccount/util.go, whose node-name extra a
// TokenReview reports). Without the ServiceAccountTokenPodNodeInfo gate
// (only possible before v1.32) every enrollment is refused: the safe failure.
package agents
