package kubetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NamespaceCleanup is how a tier empties a test's namespace of its volumes
// before deleting it, so that the next test finds the nodes' space as it
// was.
type NamespaceCleanup struct {
	// ForcePods deletes pods with no grace period: on simulated nodes no
	// kubelet confirms that they ended.
	ForcePods bool
	// Wait bounds each wait: for the StatefulSets, the pods, and the
	// claims with their PVs to be gone.
	Wait time.Duration
	// Interval is how often a wait looks again.
	Interval time.Duration
	// OnTimeout, when set, runs before a wait fails the test (to report
	// what else went wrong).
	OnTimeout func(t *testing.T)
}

// NewNamespace creates a namespace named prefix and a random suffix for
// one test, and registers c's DeleteNamespaceVolumes on it for when the
// test ends.
func NewNamespace(t *testing.T, cs kubernetes.Interface, prefix string, c NamespaceCleanup) string {
	t.Helper()
	ctx := Ctx(t, time.Minute)
	ns := fmt.Sprintf("%s-%04x", prefix, rand.IntN(1<<16))
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	t.Cleanup(func() { c.DeleteNamespaceVolumes(t, cs, ns) })
	return ns
}

// DeleteNamespaceVolumes deletes ns's StatefulSets and waits until they
// are gone (so that none makes new pods or claims), then its pods and
// waits until they are gone (a kubelet unpublishes and unstages their
// volumes as it tears them down), then its claims and waits until they
// and their PVs are gone, and last ns itself.
func (c NamespaceCleanup) DeleteNamespaceVolumes(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*c.Wait)
	defer cancel()
	var onTimeout func()
	if c.OnTimeout != nil {
		onTimeout = func() { c.OnTimeout(t) }
	}
	wait := func(what string, cond func(ctx context.Context) (bool, string, error)) {
		t.Helper()
		Poll(t, c.Interval, c.Wait, what, cond, onTimeout)
	}
	all := metav1.ListOptions{}
	if err := cs.AppsV1().StatefulSets(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil {
		t.Errorf("cleanup: delete StatefulSets of %s: %v", ns, err)
	}
	wait("StatefulSets of namespace "+ns+" to be deleted", func(ctx context.Context) (bool, string, error) {
		list, err := cs.AppsV1().StatefulSets(ns).List(ctx, all)
		if err != nil {
			return false, "", err
		}
		return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items)), nil
	})
	podDelete := metav1.DeleteOptions{}
	if c.ForcePods {
		zero := int64(0)
		podDelete.GracePeriodSeconds = &zero
	}
	if err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, podDelete, all); err != nil {
		t.Errorf("cleanup: delete pods of %s: %v", ns, err)
	}
	wait("pods of namespace "+ns+" to be deleted", func(ctx context.Context) (bool, string, error) {
		list, err := cs.CoreV1().Pods(ns).List(ctx, all)
		if err != nil {
			return false, "", err
		}
		return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items)), nil
	})
	if err := cs.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil {
		t.Errorf("cleanup: delete PVCs of %s: %v", ns, err)
	}
	wait("PVCs of namespace "+ns+" and their PVs to be deleted", func(ctx context.Context) (bool, string, error) {
		pvcs, err := cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, all)
		if err != nil {
			return false, "", err
		}
		pvs, err := cs.CoreV1().PersistentVolumes().List(ctx, all)
		if err != nil {
			return false, "", err
		}
		var left []string
		for _, pvc := range pvcs.Items {
			left = append(left, "PVC "+pvc.Name)
		}
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
				left = append(left, "PV "+pv.Name+"("+string(pv.Status.Phase)+lastEvent(ctx, cs, pv.Name)+")")
			}
		}
		return len(left) == 0, "left: " + strings.Join(left, ", "), nil
	})
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("cleanup: delete namespace %s: %v", ns, err)
	}
}

// lastEvent is ", last event: <reason>: <message>" of the PV name (a
// failed DeleteVolume says why there), "" when it has none.
func lastEvent(ctx context.Context, cs kubernetes.Interface, name string) string {
	evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=PersistentVolume,involvedObject.name=" + name})
	if err != nil || len(evs.Items) == 0 {
		return ""
	}
	last := evs.Items[0]
	for _, e := range evs.Items[1:] {
		if e.LastTimestamp.After(last.LastTimestamp.Time) {
			last = e
		}
	}
	return fmt.Sprintf(", last event: %s: %s (x%d)", last.Reason, last.Message, last.Count)
}
