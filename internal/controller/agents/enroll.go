package agents

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/nodeca"
)

var errRefused = errors.New("enrollment refused")

// The user extras the API server sets for a pod-bound service-account token.
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// enroll proves the agent is the node it claims, installs a certificate
// for that node on it and returns it, over a connection of its own.
func (a *agent) enroll(ctx context.Context) (*x509.Certificate, error) {
	cfg := a.p.cfg
	conn, err := a.p.dial(a.ep.Addr, enrollTLS(cfg.Identity))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }() // nothing to flush: every call below has returned

	ctx, cancel := context.WithTimeout(ctx, a.p.t.callTimeout)
	defer cancel()
	client := nodeagentv1.NewNodeAgentClient(conn)
	resp, err := client.Enroll(ctx, &nodeagentv1.EnrollRequest{})
	if err != nil {
		return nil, fmt.Errorf("Enroll: %w", err)
	}
	review, err := cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authv1.TokenReview{
		Spec: authv1.TokenReviewSpec{Token: resp.GetToken(), Audiences: []string{cfg.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("TokenReview: %w", err)
	}
	if err := checkReview(review.Status, a.p.wantUser(), cfg.Audience, a.ep, resp.GetNodeName()); err != nil {
		return nil, err
	}
	der, err := cfg.Issuer.SignNodeCSR(a.ep.Node, resp.GetCsrDer())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errRefused, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse the signed certificate: %w", err)
	}
	if _, err := client.InstallCertificate(ctx, &nodeagentv1.InstallCertificateRequest{CertificateDer: der}); err != nil {
		return nil, fmt.Errorf("InstallCertificate: %w", err)
	}
	return cert, nil
}

// enrollTLS does not verify the agent's certificate: it has none from
// carve's CA yet, and proves itself with its token (package comment).
func enrollTLS(id *nodeca.Keypair) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: id.GetClientCertificate,
		InsecureSkipVerify:   true, //nolint:gosec // G402: the agent is proven by its TokenReview, and only public data goes to it.
	}
}

// checkReview holds the TokenReview's answer against the endpoint dialed
// and the node claimed; mismatches wrap errRefused and never name the token.
func checkReview(st authv1.TokenReviewStatus, wantUser, audience string, ep endpoint, claimed string) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errRefused, fmt.Sprintf(format, args...))
	}
	switch {
	case claimed != ep.Node:
		return refuse("the agent claims node %q, its endpoint is on node %q", claimed, ep.Node)
	case !st.Authenticated:
		return refuse("token not authenticated (%s)", st.Error)
	case st.User.Username != wantUser:
		return refuse("token of %q, want %q", st.User.Username, wantUser)
	case !slices.Contains(st.Audiences, audience):
		return refuse("token audiences %q lack %q", st.Audiences, audience)
	}
	extra := st.User.Extra
	if pod := only(extra[extraPodName]); pod != ep.Pod {
		return refuse("token bound to pod %q, the endpoint is pod %q", pod, ep.Pod)
	}
	if uid := only(extra[extraPodUID]); uid != "" && ep.UID != "" && uid != string(ep.UID) {
		return refuse("token bound to pod UID %q, the endpoint's pod has UID %q", uid, ep.UID)
	}
	switch nodes := extra[extraNodeName]; {
	case len(nodes) == 0:
		return refuse("token names no node (needs the API server's ServiceAccountTokenPodNodeInfo, GA since Kubernetes v1.32)")
	case len(nodes) > 1 || nodes[0] != ep.Node:
		return refuse("token's pod is on node %q, the endpoint is on node %q", strings.Join(nodes, ","), ep.Node)
	}
	return nil
}

func only(v authv1.ExtraValue) string {
	if len(v) != 1 {
		return ""
	}
	return v[0]
}
