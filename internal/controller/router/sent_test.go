package router

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/carve-csi/carve/internal/volume"
)

// TestCreateRecordCostsOneWriteEachWay: the claim's record of a create is
// written once however often the create is retried on its node, written
// again when someone took it off meanwhile, kept when the node made the
// volume (and when the router refuses the answer), and taken off when the
// node made nothing.
func TestCreateRecordCostsOneWriteEachWay(t *testing.T) {
	as := newAgents()
	r, _ := newRouter(t, as, nil)
	client := fake.NewClientset(
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data-1"}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data-2"}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data-3"}})
	var patches atomic.Int32
	client.PrependReactor("patch", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		patches.Add(1)
		return false, nil, nil
	})
	r.cfg.Sent = ClaimAnnotations{Client: client}

	hang := func(on bool) func() {
		return func() {
			as["node-a"].set(func() {
				as["node-a"].hang = nil
				if on {
					as["node-a"].hang = map[string]bool{"CreateVolume": true}
				}
			})
		}
	}
	steps := []struct {
		name    string
		do      func()
		claim   string
		code    codes.Code
		record  string
		patches int32 // in all, after the step
	}{
		{name: "first attempt held by the node: written", do: hang(true), claim: "data-1", code: codes.DeadlineExceeded, record: "node-a", patches: 1},
		{name: "retried on the same node: not written again", claim: "data-1", code: codes.DeadlineExceeded, record: "node-a", patches: 1},
		{name: "and again", claim: "data-1", code: codes.DeadlineExceeded, record: "node-a", patches: 1},
		{name: "taken off by a person, retried: written again", do: func() {
			patch := []byte(`{"metadata":{"annotations":{"` + AnnCreateSentTo + `":null}}}`)
			if _, err := client.CoreV1().PersistentVolumeClaims("app").Patch(context.Background(), "data-1", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}, claim: "data-1", code: codes.DeadlineExceeded, record: "node-a", patches: 3},
		// csi-provisioner may end before it writes the PV: its next
		// attempt must still find the claim tied to the node.
		{name: "the node made it: kept", do: hang(false), claim: "data-1", code: codes.OK, record: "node-a", patches: 3},
		{name: "made at the first attempt: written once", claim: "data-2", code: codes.OK, record: "node-a", patches: 4},
		{name: "and repeated: not written again", claim: "data-2", code: codes.OK, record: "node-a", patches: 4},
		{name: "an answer the router refuses: kept", do: func() {
			as["node-a"].set(func() { as["node-a"].tamper = onCreate(func(v *csi.Volume) { v.VolumeContext = nil }) })
		}, claim: "data-3", code: codes.Internal, record: "node-a", patches: 5},
		{name: "the node made nothing: taken off", do: func() {
			as["node-a"].set(func() {
				as["node-a"].tamper = nil
				as["node-a"].fail = map[string]error{"CreateVolume": status.Error(codes.ResourceExhausted, "no room")}
			})
		}, claim: "data-3", code: codes.ResourceExhausted, record: "", patches: 6},
	}
	for _, st := range steps {
		if st.do != nil {
			st.do()
		}
		err := createForClaim(r, st.claim, st.code)
		t.Run(st.name, func(t *testing.T) {
			wantStatus(t, err, st.code)
			if got := recordOn(t, client, st.claim); got != st.record {
				t.Errorf("claim %s records %q, want %q", st.claim, got, st.record)
			}
			if got := patches.Load(); got != st.patches {
				t.Errorf("%d patches of claims in all, want %d", got, st.patches)
			}
		})
	}
}

// createForClaim asks r for the volume of claim app/<claim> on node-a,
// wanting code: only a call the node is to hold (DEADLINE_EXCEEDED) gets
// a short deadline.
func createForClaim(r *Server, claim string, code codes.Code) error {
	timeout := 30 * time.Second
	if code == codes.DeadlineExceeded {
		timeout = 300 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := r.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-" + claim, VolumeCapabilities: mountRWO, AccessibilityRequirements: strict("node-a"),
		Parameters: map[string]string{volume.ParamPVCNamespace: "app", volume.ParamPVCName: claim}})
	return err
}

// recordOn is the node claim app/<claim> records its create was sent to.
func recordOn(t *testing.T, client kubernetes.Interface, claim string) string {
	t.Helper()
	c, err := client.CoreV1().PersistentVolumeClaims("app").Get(context.Background(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Annotations[AnnCreateSentTo]
}
