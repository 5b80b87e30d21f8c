//go:build e2e

package e2e

import (
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// access is one request a service account makes (or must not be able to).
type access struct {
	verb, group, resource, subresource, namespace string
}

// TestRBACAgainstAPIServer asks the real API server, with a
// SubjectAccessReview per request, whether each of carve's service
// accounts (RBAC of deploy/kubernetes as applied, plus the
// delete-claims-of-lost-nodes component) may do what its containers need,
// and may not do a few things they must not. A needed request that is
// denied fails the test, as does an extra one that is allowed.
func TestRBACAgainstAPIServer(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	ns := bed.Namespace
	cluster := func(verb, group, resource string) access { return access{verb, group, resource, "", ""} }
	local := func(verb, group, resource string) access { return access{verb, group, resource, "", ns} }
	tests := []struct {
		sa              string
		allowed, denied []access
	}{
		{sa: "carve-node",
			allowed: []access{
				// the carve plugin's audit
				cluster("list", "", "persistentvolumes"), cluster("watch", "", "persistentvolumes"),
				{"get", "", "persistentvolumeclaims", "", "default"},
				{"create", "", "events", "", "default"}, {"patch", "", "events", "", "default"},
				// csi-provisioner
				cluster("create", "", "persistentvolumes"), cluster("delete", "", "persistentvolumes"),
				cluster("update", "", "persistentvolumeclaims"), cluster("get", "storage.k8s.io", "csinodes"),
				cluster("list", "storage.k8s.io", "storageclasses"), cluster("get", "", "nodes"),
				local("create", "storage.k8s.io", "csistoragecapacities"), local("get", "", "pods"),
			},
			denied: []access{
				cluster("update", "", "persistentvolumes"), cluster("delete", "", "persistentvolumeclaims"),
				cluster("patch", "", "nodes"), cluster("list", "", "pods"), local("get", "", "secrets"),
				{"create", "storage.k8s.io", "csistoragecapacities", "", "default"},
			}},
		{sa: "carve-controller",
			allowed: []access{
				// carve controller's lost-node watch
				cluster("get", "", "nodes"), cluster("list", "", "nodes"), cluster("watch", "", "nodes"),
				cluster("list", "", "persistentvolumes"), cluster("watch", "", "persistentvolumes"),
				{"create", "", "events", "", "default"}, {"patch", "", "events", "", "default"},
				local("get", "coordination.k8s.io", "leases"), local("create", "coordination.k8s.io", "leases"),
				local("update", "coordination.k8s.io", "leases"),
				// ... with --delete-claims-of-lost-nodes (the component)
				{"get", "", "persistentvolumeclaims", "", "default"}, {"delete", "", "persistentvolumeclaims", "", "default"},
				cluster("delete", "", "persistentvolumes"), cluster("update", "", "persistentvolumes"),
				// csi-resizer
				cluster("patch", "", "persistentvolumes"), {"patch", "", "persistentvolumeclaims", "status", "default"},
			},
			denied: []access{
				cluster("delete", "", "nodes"), cluster("patch", "", "nodes"), cluster("create", "", "persistentvolumes"),
				{"create", "", "persistentvolumeclaims", "", "default"}, {"delete", "", "pods", "", "default"},
				local("get", "", "secrets"), {"create", "coordination.k8s.io", "leases", "", "kube-system"},
			}},
	}
	for _, tc := range tests {
		user := "system:serviceaccount:" + ns + ":" + tc.sa
		groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
		check := func(a access, want bool) {
			t.Helper()
			r, err := bed.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: a.namespace, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status.Allowed != want {
				t.Errorf("%s: %s %s/%s/%s in %q: allowed %v, want %v (%s)", tc.sa, a.verb, a.group, a.resource, a.subresource, a.namespace,
					r.Status.Allowed, want, r.Status.Reason)
			}
		}
		for _, a := range tc.allowed {
			check(a, true)
		}
		for _, a := range tc.denied {
			check(a, false)
		}
	}
}
