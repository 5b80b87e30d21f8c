package nodeca

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// ParseBundle returns a PEM bundle's CAs; anything else invalidates it all, so a damaged
// file is never half trusted.
func ParseBundle(data []byte) ([]*x509.Certificate, error) {
	var cas []*x509.Certificate
	for rest := data; len(bytes.TrimSpace(rest)) > 0; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("CA bundle: data after certificate %d is not PEM", len(cas))
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("CA bundle: PEM block %d is %q, want \"CERTIFICATE\"", len(cas)+1, block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("CA bundle: certificate %d: %w", len(cas)+1, err)
		}
		if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
			return nil, fmt.Errorf("CA bundle: certificate %d (%s) is not a CA", len(cas)+1, cert.Subject)
		}
		cas = append(cas, cert)
	}
	if len(cas) == 0 {
		return nil, errors.New("CA bundle: no certificate")
	}
	return cas, nil
}

// BundleFile keeps a Pool trusting a PEM file the kubelet swaps on rotation. It trusts
// nothing until a valid read; a file that vanishes or breaks later keeps the last bundle.
type BundleFile struct {
	path string
	pool *Pool

	mu sync.Mutex
	// seen is the file last read; problem is why the pool lacks its CAs now.
	seen    os.FileInfo
	problem error
}

// NewBundleFile returns a BundleFile trusting nothing until Load succeeds.
func NewBundleFile(path string) *BundleFile {
	return &BundleFile{path: path, pool: NewPool(), problem: errors.New("CA bundle not read yet")}
}

// Pool is the pool kept current with the file.
func (b *BundleFile) Pool() *Pool { return b.pool }

// Load reads the file when it changed and returns what is wrong with it now.
func (b *BundleFile) Load() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	fi, err := os.Stat(b.path)
	if err != nil {
		b.seen = nil
		b.problem = fmt.Errorf("CA bundle %s: %w", b.path, err)
		return b.problem
	}
	if b.seen != nil && os.SameFile(b.seen, fi) && b.seen.ModTime().Equal(fi.ModTime()) && b.seen.Size() == fi.Size() {
		return b.problem
	}
	b.seen = fi
	data, err := os.ReadFile(b.path)
	if err != nil {
		b.seen = nil
		b.problem = fmt.Errorf("CA bundle %s: %w", b.path, err)
		return b.problem
	}
	cas, err := ParseBundle(data)
	if err != nil {
		b.problem = fmt.Errorf("%s: %w", b.path, err)
		return b.problem
	}
	b.pool.Set(cas...)
	b.problem = nil
	return nil
}

// DefaultBundleCheck: a rotated CA is trusted seconds after the kubelet writes it.
const DefaultBundleCheck = 2 * time.Second

// Run loads the file every interval until ctx ends.
func (b *BundleFile) Run(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx).WithValues("file", b.path)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var logged string
	for {
		prev := b.pool.CertPool()
		err := b.Load()
		switch {
		case err != nil && err.Error() != logged:
			logged = err.Error()
			if prev == nil {
				logger.Error(err, "No valid CA bundle for the node channel: every handshake is refused until there is one")
			} else {
				logger.Error(err, "The node channel's CA bundle cannot be read; still trusting the last valid one")
			}
		case err == nil && b.pool.CertPool() != prev:
			logged = ""
			logger.Info("Trusting the node channel's CA bundle")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
