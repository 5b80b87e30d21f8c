package kubetest

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/carve-csi/carve/internal/controller/router"
)

// LocalOnlyClass creates name, a copy of the StorageClass base with
// carve.dev/cross-node-copy "false" (its restores and clones are made on
// their source's node or refused, never copied), as ClassLike does.
func LocalOnlyClass(t *testing.T, ctx context.Context, cs kubernetes.Interface, capacityNS, base, name string) string {
	t.Helper()
	return ClassLike(t, ctx, cs, capacityNS, base, name, map[string]string{router.ParamCrossNodeCopy: "false"})
}

// ClassLike creates name, a copy of the StorageClass base with params
// set over base's parameters, deleted when the test ends, and waits until
// carve controller has written its capacity, in capacityNS, on as many
// nodes as base's (the scheduler considers a node for a claim of a class
// only where it has). It returns name.
func ClassLike(t *testing.T, ctx context.Context, cs kubernetes.Interface, capacityNS, base, name string, params map[string]string) string {
	t.Helper()
	sc, err := cs.StorageV1().StorageClasses().Get(ctx, base, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	like := sc.DeepCopy()
	like.ObjectMeta = metav1.ObjectMeta{Name: name}
	if like.Parameters == nil {
		like.Parameters = map[string]string{}
	}
	maps.Copy(like.Parameters, params)
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, like, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := cs.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete StorageClass %s: %v", name, err)
		}
	})
	Poll(t, time.Second, 3*time.Minute, "the capacity of "+name+" on the nodes that have "+base+"'s", func(ctx context.Context) (bool, string, error) {
		caps, err := cs.StorageV1().CSIStorageCapacities(capacityNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		count := map[string]int{}
		for _, c := range caps.Items {
			count[c.StorageClassName]++
		}
		return count[base] > 0 && count[name] >= count[base], fmt.Sprintf("%d of %d", count[name], count[base]), nil
	}, nil)
	return name
}
