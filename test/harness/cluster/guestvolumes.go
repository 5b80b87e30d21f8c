package cluster

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// lvNameRE is what a volume group or LV name may hold (LVM's own rule,
// narrowed to what carve makes): it keeps a handle out of the shell.
var lvNameRE = regexp.MustCompile(`^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$`)

// SHA256OfLV returns the SHA-256 of the whole device of the LV vgLV
// ("vg/lv", a carve volume or snapshot ID) in the guest, of the guest
// node's volume groups or a peer's alike (they share the guest's
// device-mapper). An inactive LV is activated first (a thin snapshot
// skips activation by default).
func (g *GuestNode) SHA256OfLV(ctx context.Context, vgLV string) (string, error) {
	vg, lv, ok := strings.Cut(vgLV, "/")
	if !ok || !lvNameRE.MatchString(vg) || !lvNameRE.MatchString(lv) {
		return "", fmt.Errorf("LV %q: want vg/lv", vgLV)
	}
	dev := "/dev/" + vg + "/" + lv
	out, err := g.Exec(ctx, fmt.Sprintf("set -e\n[ -e %[1]s ] || lvchange -q -ay -K %[2]s/%[3]s\nsha256sum < %[1]s\n", dev, vg, lv))
	if err != nil {
		return "", fmt.Errorf("SHA-256 of %s: %w", vgLV, err)
	}
	f := strings.Fields(out)
	if len(f) == 0 || len(f[0]) != 64 {
		return "", fmt.Errorf("SHA-256 of %s: sha256sum printed %q", vgLV, out)
	}
	return f[0], nil
}

// ForceDeletePodsOn deletes every pod bound to node at once (grace period
// 0) and returns their namespace/names. A pod on a node without a kubelet
// (a simulated node, a peer) is never confirmed gone by one, and a
// graceful delete leaves it terminating for good; a workload's controller
// then makes its replacement.
func ForceDeletePodsOn(ctx context.Context, cs kubernetes.Interface, node string) ([]string, error) {
	pods, err := cs.CoreV1().Pods(corev1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("pods on node %s: %w", node, err)
	}
	var deleted []string
	for _, p := range pods.Items {
		if isDaemonSetPod(&p) {
			continue // the node's own agent pod: its token is bound to it
		}
		err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		if err != nil && !apierrors.IsNotFound(err) {
			return deleted, fmt.Errorf("delete pod %s/%s on node %s: %w", p.Namespace, p.Name, node, err)
		}
		deleted = append(deleted, p.Namespace+"/"+p.Name)
	}
	return deleted, nil
}

// isDaemonSetPod tells a pod that a DaemonSet owns.
func isDaemonSetPod(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}
