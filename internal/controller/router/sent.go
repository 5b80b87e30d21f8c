package router

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// AnnCreateSentTo is the annotation on a claim that names the node its
// CreateVolume was sent to: written before the call leaves, taken off when
// that node answers for sure, that it made nothing or that it made the
// volume (csi-provisioner then writes the PersistentVolume, which is the
// record from there on). Every replica reads it, and so does a controller
// that restarted, so that a create in doubt (the call sent, its answer
// never seen) keeps the claim on that node rather than making its volume a
// second time elsewhere and leaving the first behind.
const AnnCreateSentTo = "carve.dev/create-sent-to"

// SentCreates keeps AnnCreateSentTo on claims.
type SentCreates interface {
	// SentTo is the node the claim's CreateVolume was sent to, "" when
	// none is recorded (or the claim is gone).
	SentTo(ctx context.Context, namespace, claim string) (string, error)
	// Sending records node before a CreateVolume of the claim is sent
	// there; a record that names node already stays as it is.
	Sending(ctx context.Context, namespace, claim, node string) error
	// NotMade takes the record off once the node answered that it made
	// nothing.
	NotMade(ctx context.Context, namespace, claim string) error
}

// ClaimAnnotations keeps AnnCreateSentTo through the API server.
type ClaimAnnotations struct {
	Client kubernetes.Interface
}

var _ SentCreates = ClaimAnnotations{}

// SentTo reads the claim.
func (c ClaimAnnotations) SentTo(ctx context.Context, namespace, claim string) (string, error) {
	pvc, err := c.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading claim %s/%s: %w", namespace, claim, err)
	}
	return pvc.Annotations[AnnCreateSentTo], nil
}

// Sending annotates the claim unless it names node already: a retry on
// the same node costs a read, not a write. The read is a quorum read, not
// the watch cache's, since skipping a record another replica or a person
// just took off would send a create with no record. A claim that is gone
// needs no record.
func (c ClaimAnnotations) Sending(ctx context.Context, namespace, claim, node string) error {
	sent, err := c.SentTo(ctx, namespace, claim)
	if err != nil || sent == node {
		return err
	}
	return c.patch(ctx, namespace, claim, &node)
}

// NotMade takes the annotation off.
func (c ClaimAnnotations) NotMade(ctx context.Context, namespace, claim string) error {
	return c.patch(ctx, namespace, claim, nil)
}

func (c ClaimAnnotations) patch(ctx context.Context, namespace, claim string, node *string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{AnnCreateSentTo: node}}})
	if err != nil {
		return err
	}
	_, err = c.Client.CoreV1().PersistentVolumeClaims(namespace).Patch(ctx, claim, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("annotating claim %s/%s: %w", namespace, claim, err)
	}
	return nil
}
