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

// AnnCreateSentTo names, on a claim, the node its CreateVolume was sent to:
// written before the call leaves, removed once the node answers for sure.
// Every replica and a restarted controller read it, so a create in doubt
// keeps the claim on that node rather than making a second volume elsewhere.
const AnnCreateSentTo = "carve.dev/create-sent-to"

// SentCreates keeps AnnCreateSentTo on claims.
type SentCreates interface {
	// SentTo is the recorded node, "" when none (or the claim is gone).
	SentTo(ctx context.Context, namespace, claim string) (string, error)
	// Sending records node before a CreateVolume is sent there.
	Sending(ctx context.Context, namespace, claim, node string) error
	// NotMade takes the record off once the node made nothing.
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

// Sending annotates the claim unless it names node already. The read is a
// quorum read: a stale cache could skip a record just taken off and send a
// create with none. A gone claim needs no record.
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
