//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/api/moveapi"
)

// TestMoveRequestPolicy: the ValidatingAdmissionPolicy of
// docs/operations.md ("Who may ask for a move"), applied as the document
// shows it, makes asking for a move a right of its own: a user who may
// patch claims but holds no create on moves.carve.dev is refused a new
// carve.dev/move-to, may still change the claim otherwise, and once the
// document's Role is bound to a group of the user, may ask. The policy is
// read from the document, so that what operators copy is what is tested.
func TestMoveRequestPolicy(t *testing.T) {
	ns := newNamespace(t, "movepolicy")
	ctx := testCtx(t, 3*time.Minute)
	objs := policyFromDocs(t, ns)
	cfg, err := clientcmd.BuildConfigFromFlags("", bed.Control.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapping := map[string]schema.GroupVersionResource{
		"ValidatingAdmissionPolicy":        {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"},
		"ValidatingAdmissionPolicyBinding": {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"},
		"Role":                             {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
		"RoleBinding":                      {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	}
	create := func(u *unstructured.Unstructured) {
		t.Helper()
		gvr, ok := mapping[u.GetKind()]
		if !ok {
			t.Fatalf("docs/operations.md's policy holds a %s", u.GetKind())
		}
		var ri dynamic.ResourceInterface = dc.Resource(gvr)
		if u.GetNamespace() != "" {
			ri = dc.Resource(gvr).Namespace(u.GetNamespace())
		}
		if _, err := ri.Create(ctx, u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		if u.GetNamespace() == "" {
			t.Cleanup(func() {
				if err := ri.Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete %s %s: %v", u.GetKind(), u.GetName(), err)
				}
			})
		}
	}
	var grant []*unstructured.Unstructured
	for _, u := range objs {
		if strings.HasPrefix(u.GetKind(), "ValidatingAdmissionPolicy") {
			create(u)
		} else {
			grant = append(grant, u)
		}
	}
	if len(grant) != 2 {
		t.Fatalf("docs/operations.md's policy: want a Role and a RoleBinding besides the policy, got %d objects", len(grant))
	}

	// alice may patch claims in ns (and nothing else).
	if _, err := bed.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "claim-editor"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "patch"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bed.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "claim-editor"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "alice", APIGroup: rbacv1.GroupName}},
		RoleRef:  rbacv1.RoleRef{Kind: "Role", Name: "claim-editor", APIGroup: rbacv1.GroupName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, newPVC(ns, "data", thickSC, "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	as := func(groups ...string) kubernetes.Interface {
		c := rest.CopyConfig(cfg)
		c.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: append([]string{"system:authenticated"}, groups...)}
		cs, err := kubernetes.NewForConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	annotate := func(cs kubernetes.Interface, k, v string) error {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, k, v)
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}

	// The policy takes effect within seconds of its creation.
	waitFor(t, time.Minute, "alice's carve.dev/move-to refused by the policy", func(context.Context) (bool, string, error) {
		err := annotate(as(), moveapi.AnnMoveTo, "*")
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "moves.carve.dev"), fmt.Sprint(err), nil
	})
	if err := annotate(as(), "example.com/note", "x"); err != nil {
		t.Errorf("alice's other annotation: %v, want it admitted", err)
	}
	for _, u := range grant {
		create(u)
	}
	group := grant[1].Object["subjects"].([]any)[0].(map[string]any)["name"].(string)
	waitFor(t, time.Minute, "carve.dev/move-to admitted from alice in group "+group, func(context.Context) (bool, string, error) {
		err := annotate(as(group), moveapi.AnnMoveTo, "*")
		return err == nil, fmt.Sprint(err), nil
	})
}

// policyFromDocs returns the objects of the YAML block of
// docs/operations.md that holds the ValidatingAdmissionPolicy, with the
// example namespace replaced by ns.
func policyFromDocs(t *testing.T, ns string) []*unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i := strings.Index(doc, "kind: ValidatingAdmissionPolicy\n")
	if i < 0 {
		t.Fatal("docs/operations.md shows no ValidatingAdmissionPolicy")
	}
	start := strings.LastIndex(doc[:i], "```yaml\n") + len("```yaml\n")
	end := i + strings.Index(doc[i:], "```")
	var out []*unstructured.Unstructured
	for _, part := range strings.Split(doc[start:end], "\n  ---\n") {
		var lines []string
		for _, l := range strings.Split(part, "\n") {
			lines = append(lines, strings.TrimPrefix(l, "  "))
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(strings.Join(lines, "\n")), &u.Object); err != nil {
			t.Fatalf("docs/operations.md's policy: %v", err)
		}
		if u.GetNamespace() != "" {
			u.SetNamespace(ns)
		}
		out = append(out, u)
	}
	return out
}
