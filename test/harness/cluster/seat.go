package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Seat is what the API server holds for a node agent a test runs itself
// (one that lies, say): a Node, the node DaemonSet's pod on it, that pod's
// token for the controller's audience, and the CA bundle the controller
// publishes. An agent with these enrolls like any other: the controller
// signs it a genuine node certificate.
type Seat struct {
	Node, Pod string
	// TokenFile and CAFile are what the kubelet would mount.
	TokenFile, CAFile string
}

// SeatAgent makes a Seat for node name, its files in dir.
func (c *Cluster) SeatAgent(ctx context.Context, name, dir string) (*Seat, error) {
	if c.NodeChannel == nil {
		return nil, errors.New("the test bed has no node channel (no simulated nodes)")
	}
	ds, err := c.Manifests.NodeDaemonSet()
	if err != nil {
		return nil, err
	}
	if err := createNodeObjects(ctx, c.Client, name); err != nil {
		return nil, err
	}
	pods, err := waitDaemonSetPods(ctx, c.Client, ds, []string{name}, 2*time.Minute)
	if err != nil {
		return nil, err
	}
	s := &Seat{Node: name, Pod: pods[name], TokenFile: filepath.Join(dir, "token"), CAFile: filepath.Join(dir, "ca.crt")}
	if err := c.NodeChannel.writeTokenFor(ctx, c.Client, name, s.Pod, s.TokenFile, c.Config.Lifetime); err != nil {
		return nil, err
	}
	ca, err := c.NodeChannel.waitCABundle(ctx, c.Client, c.Central, time.Minute)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(s.CAFile, ca, 0o644); err != nil {
		return nil, err
	}
	return s, nil
}

// PublishSeat does the EndpointSlice controller's part for the seat's
// agent, listening on port of the host's address.
func (c *Cluster) PublishSeat(ctx context.Context, s *Seat, port int) error {
	return c.NodeChannel.publishSlice(ctx, c.Client, s.Node, s.Pod, s.Node, c.NodeChannel.IP, port)
}

// Unseat deletes what SeatAgent and PublishSeat made: the EndpointSlice,
// the pod and the Node.
func (c *Cluster) Unseat(ctx context.Context, s *Seat) error {
	nc := c.NodeChannel
	var errs []error
	for _, del := range []func() error{
		func() error {
			return c.Client.DiscoveryV1().EndpointSlices(nc.Namespace).Delete(ctx, nc.EndpointSliceName(s.Node), metav1.DeleteOptions{})
		},
		func() error { return c.Client.CoreV1().Nodes().Delete(ctx, s.Node, metav1.DeleteOptions{}) },
		func() error {
			return c.Client.CoreV1().Pods(nc.Namespace).Delete(ctx, s.Pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		},
	} {
		if err := del(); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing the seat of node %s: %w", s.Node, err)
	}
	return nil
}
