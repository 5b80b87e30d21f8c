package nodeca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sync/atomic"
	"time"
)

// DefaultLeafValidity is short, so a stolen node key expires within a day.
const DefaultLeafValidity = 24 * time.Hour

// ControllerURI is the identity of the carve controller.
const ControllerURI = "carve://controller"

const nodeURIPrefix = "carve://node/"

// NodeURI returns the named node's identity, checking the name.
func NodeURI(node string) (string, error) {
	if err := ValidateNodeName(node); err != nil {
		return "", err
	}
	return nodeURIPrefix + node, nil
}

// dns1123Subdomain restates apimachinery's rule so the node agent need not link it.
var dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// ValidateNodeName refuses anything that is not a Kubernetes node name.
func ValidateNodeName(node string) error {
	if len(node) > 253 || !dns1123Subdomain.MatchString(node) {
		return fmt.Errorf("node name %q: must be a DNS-1123 subdomain "+
			"(at most 253 lowercase letters, digits, '-' and '.', "+
			"starting and ending with a letter or digit, e.g. worker-1.example)", node)
	}
	return nil
}

// IssuerOptions configures an Issuer.
type IssuerOptions struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// NodeValidity is node certificates' life; 0 means DefaultLeafValidity.
	NodeValidity time.Duration
	// ControllerValidity is controller certificates' life; 0 means DefaultLeafValidity.
	ControllerValidity time.Duration
}

// Issuer signs controller and node certificates with a CA SetCA may replace.
type Issuer struct {
	ca                 atomic.Pointer[CA]
	now                func() time.Time
	nodeValidity       time.Duration
	controllerValidity time.Duration
}

// NewIssuer returns an Issuer that signs with ca.
func NewIssuer(ca *CA, opts IssuerOptions) (*Issuer, error) {
	if ca == nil {
		return nil, errors.New("issuer: no CA")
	}
	if opts.NodeValidity < 0 || opts.ControllerValidity < 0 {
		return nil, errors.New("issuer: validity must be positive")
	}
	iss := &Issuer{now: clock(opts.Now),
		nodeValidity: opts.NodeValidity, controllerValidity: opts.ControllerValidity}
	iss.ca.Store(ca)
	if iss.nodeValidity == 0 {
		iss.nodeValidity = DefaultLeafValidity
	}
	if iss.controllerValidity == 0 {
		iss.controllerValidity = DefaultLeafValidity
	}
	return iss, nil
}

// SetCA makes ca sign every certificate issued from now on.
func (iss *Issuer) SetCA(ca *CA) { iss.ca.Store(ca) }

// CA is the CA that signs now.
func (iss *Issuer) CA() *CA { return iss.ca.Load() }

// IssueController generates a key and a controller client certificate.
func (iss *Issuer) IssueController() (*tls.Certificate, error) {
	return iss.issue("carve-controller", ControllerURI, x509.ExtKeyUsageClientAuth, iss.controllerValidity)
}

// IssueNode generates a key and a server certificate for exactly node.
func (iss *Issuer) IssueNode(node string) (*tls.Certificate, error) {
	uri, err := NodeURI(node)
	if err != nil {
		return nil, err
	}
	return iss.issue(node, uri, x509.ExtKeyUsageServerAuth, iss.nodeValidity)
}

// SignNodeCSR signs a node's request, so its key never leaves the node. The identity is
// node, established by the caller, never the request's subject or SANs.
func (iss *Issuer) SignNodeCSR(node string, csrDER []byte) ([]byte, error) {
	uri, err := NodeURI(node)
	if err != nil {
		return nil, err
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("node %s: certificate request: %w", node, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("node %s: certificate request: %w", node, err)
	}
	return iss.sign(node, uri, csr.PublicKey, x509.ExtKeyUsageServerAuth, iss.nodeValidity)
}

func (iss *Issuer) issue(cn, uri string, usage x509.ExtKeyUsage, validity time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key for %s: %w", uri, err)
	}
	der, err := iss.sign(cn, uri, key.Public(), usage, validity)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate for %s: %w", uri, err)
	}
	return &tls.Certificate{
		Certificate: [][]byte{der},
		PrivateKey:  key,
		Leaf:        leaf,
	}, nil
}

// sign makes a leaf whose only identity is uri; nothing checks the common name.
func (iss *Issuer) sign(cn, uri string, pub any, usage x509.ExtKeyUsage, validity time.Duration) ([]byte, error) {
	ca := iss.ca.Load()
	now := iss.now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		// A leaf never outlives its CA: it would fail verification anyway.
		notAfter = ca.Cert.NotAfter
	}
	tmpl, err := leafTemplate(cn, uri, usage, now, notAfter)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %s: %w", uri, err)
	}
	return der, nil
}

func leafTemplate(cn, uri string, usage x509.ExtKeyUsage, now, notAfter time.Time) (*x509.Certificate, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("identity %q: %w", uri, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-ClockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		URIs:         []*url.URL{u},
	}, nil
}
