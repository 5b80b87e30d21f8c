package channel

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"os"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/nodeca"
)

// Enroll implements nodeagentv1.NodeAgentServer. An unreadable or empty
// token is FAILED_PRECONDITION.
func (a *Agent) Enroll(context.Context, *nodeagentv1.EnrollRequest) (*nodeagentv1.EnrollResponse, error) {
	data, err := os.ReadFile(a.cfg.TokenFile)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition,
			"node %s: reading the service-account token (--node-channel-token-file): %v", a.cfg.NodeName, err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return nil, status.Errorf(codes.FailedPrecondition,
			"node %s: the service-account token file %s (--node-channel-token-file) is empty", a.cfg.NodeName, a.cfg.TokenFile)
	}
	csr, err := a.csr()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "node %s: certificate request: %v", a.cfg.NodeName, err)
	}
	return &nodeagentv1.EnrollResponse{NodeName: a.cfg.NodeName, Token: token, CsrDer: csr}, nil
}

// csr's subject is for people: the controller takes the node from the
// token's review, never from the request.
func (a *Agent) csr() ([]byte, error) {
	uri, err := nodeca.NodeURI(a.cfg.NodeName)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(uri)
	if err != nil {
		return nil, err
	}
	return x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: a.cfg.NodeName},
		URIs:    []*url.URL{u},
	}, a.key)
}

// InstallCertificate implements nodeagentv1.NodeAgentServer: the certificate
// must be for the agent's key, name this node and chain to a trusted CA.
func (a *Agent) InstallCertificate(ctx context.Context, req *nodeagentv1.InstallCertificateRequest) (*nodeagentv1.InstallCertificateResponse, error) {
	cert, err := x509.ParseCertificate(req.GetCertificateDer())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "certificate_der: %v", err)
	}
	if !a.key.PublicKey.Equal(cert.PublicKey) {
		return nil, status.Errorf(codes.InvalidArgument,
			"certificate_der: the certificate (serial %x) is for another key than this agent's; enroll again", cert.SerialNumber)
	}
	if err := nodeca.VerifyNodeCertificate(cert, a.cfg.Trust, a.cfg.Now(), a.cfg.NodeName); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "certificate_der: %v", err)
	}
	a.cert.Set(&tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: a.key, Leaf: cert})
	klog.FromContext(ctx).Info("Presenting the node certificate the controller signed",
		"serial", cert.SerialNumber.Text(16), "notAfter", cert.NotAfter)
	return &nodeagentv1.InstallCertificateResponse{}, nil
}
