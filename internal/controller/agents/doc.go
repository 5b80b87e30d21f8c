// Package agents is the carve controller's side of the node channel:
// it finds the node agents through the EndpointSlices of their
// headless Service, proves who each one is, and keeps one verified gRPC
// connection per node, over which the router sends CSI Controller calls and
// from which the nodes' capacity streams are read.
//
// # Enrollment
//
// For every ready endpoint the pool dials the agent once without verifying
// its server certificate, calls Enroll, and checks the service-account token
// it returns with a TokenReview: the token must belong to the node agents'
// service account, be bound to the endpoint's pod (name, and UID when both
// sides have one), and name the endpoint's node, which must also be the node
// the agent claims. Only then is the agent's certificate request signed for
// that node and installed; the pool then dials again, this time requiring
// exactly carve://node/<node> from carve's CA, and uses that connection for
// everything else. It enrolls again at half the certificate's life and after
// every lost connection (the agent may have restarted with a new key).
//
// Why the unverified enrollment connection is safe: nothing secret travels
// from the controller to the agent on it. The controller presents its client
// certificate (public; the agent verifies it, so the agent hands its token
// only to the real controller, and a man in the middle cannot terminate TLS
// towards the agent) and sends back a signed certificate (public). The one
// secret, the token, travels from the agent to the controller, and it is
// the token, not the TLS server certificate, that proves the node: an
// impostor at the endpoint's address has no token bound to that endpoint's
// pod and gets nothing signed. The token's audience is the controller, so
// the API server accepts it only in a TokenReview that names that audience,
// never as a credential for an API request, and it dies with its pod.
//
// What the API server vouches for was checked in the Kubernetes v1.36.1
// source: a token requested for a pod carries the pod's name and UID and,
// under the feature gate ServiceAccountTokenPodNodeInfo (beta and on by
// default since v1.30, GA and locked on since v1.32), the name and UID of
// the node the pod is bound to (pod.spec.nodeName, read when the token is
// issued: pkg/registry/core/serviceaccount/storage/token.go). Validation
// (pkg/serviceaccount/claims.go) refuses a token whose pod is gone or has
// another UID, and the user it returns carries the extras
// authentication.kubernetes.io/pod-name, pod-uid, node-name and node-uid
// (k8s.io/apiserver pkg/authentication/serviceaccount/util.go), which a
// TokenReview reports in status.user.extra. On a cluster with the gate off
// (only possible before v1.32) node-name is absent and every enrollment is
// refused, which is the safe failure.
package agents
