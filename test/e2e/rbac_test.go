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
	// name is the object's name, for rules limited to resourceNames.
	name string
}

// TestRBACAgainstAPIServer asks the real API server, with a
// SubjectAccessReview per request, whether each of carve's service
// accounts (RBAC of deploy/kubernetes as applied, plus the
// delete-claims-of-lost-nodes component) may do what its containers need,
// and may not do what they must not. A needed request that is denied
// fails the test, as does an extra one that is allowed. The node agents'
// account is checked over every verb of every resource that matters
// (issue 21, failure 5: a node must not be able to write volumes, claims
// or capacity): all denied. The node agent uses no API; carve controller
// audits the nodes' LVs over the node channel.
func TestRBACAgainstAPIServer(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	ns := bed.Namespace
	ca := bed.NodeChannel.CAName
	cluster := func(verb, group, resource string) access { return access{verb: verb, group: group, resource: resource} }
	local := func(verb, group, resource string) access {
		return access{verb: verb, group: group, resource: resource, namespace: ns}
	}
	in := func(namespace, verb, group, resource string) access {
		return access{verb: verb, group: group, resource: resource, namespace: namespace}
	}
	sub := func(a access, subresource string) access { a.subresource = subresource; return a }
	named := func(a access, name string) access { a.name = name; return a }

	// The node agents' account: every verb on every resource a node could
	// use to harm volumes, claims, capacity or the node channel, or to
	// mislead operators (Events).
	var nodeDenied []access
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
	for _, r := range []access{
		cluster("", "", "persistentvolumes"),
		in("default", "", "", "persistentvolumeclaims"),
		local("", "storage.k8s.io", "csistoragecapacities"),
		in("default", "", "storage.k8s.io", "csistoragecapacities"),
		cluster("", "snapshot.storage.k8s.io", "volumesnapshotcontents"),
		in("default", "", "snapshot.storage.k8s.io", "volumesnapshots"),
		cluster("", "storage.k8s.io", "storageclasses"),
		local("", "", "secrets"),
		local("", "", "configmaps"),
		local("", "discovery.k8s.io", "endpointslices"),
		local("", "coordination.k8s.io", "leases"),
		local("", "", "pods"),
		cluster("", "", "nodes"),
		in("default", "", "", "events"),
		local("", "", "serviceaccounts"),
	} {
		for _, v := range verbs {
			a := r
			a.verb = v
			nodeDenied = append(nodeDenied, a)
		}
	}
	nodeDenied = append(nodeDenied,
		sub(local("create", "", "serviceaccounts"), "token"),
		sub(cluster("update", "", "persistentvolumes"), "status"),
		sub(in("default", "patch", "", "persistentvolumeclaims"), "status"),
		sub(cluster("update", "snapshot.storage.k8s.io", "volumesnapshotcontents"), "status"),
		cluster("create", "authentication.k8s.io", "tokenreviews"),
		named(local("get", "", "secrets"), ca))

	tests := []struct {
		sa              string
		allowed, denied []access
	}{
		{sa: "carve-node", denied: nodeDenied},
		{sa: "carve-controller",
			allowed: []access{
				// carve controller's audit: carve's PVs, the claim of an
				// orphan, Events on the Node, the PV and the claim
				in("default", "get", "", "persistentvolumeclaims"),
				// carve controller's lost-node watch
				cluster("get", "", "nodes"), cluster("list", "", "nodes"), cluster("watch", "", "nodes"),
				cluster("list", "", "persistentvolumes"), cluster("watch", "", "persistentvolumes"),
				in("default", "create", "", "events"), in("default", "patch", "", "events"),
				local("get", "coordination.k8s.io", "leases"), local("create", "coordination.k8s.io", "leases"),
				local("update", "coordination.k8s.io", "leases"),
				// ... with --delete-claims-of-lost-nodes (the component)
				in("default", "get", "", "persistentvolumeclaims"), in("default", "delete", "", "persistentvolumeclaims"),
				cluster("delete", "", "persistentvolumes"), cluster("update", "", "persistentvolumes"),
				// carve controller's node channel: the agents' tokens, their
				// EndpointSlices, the CA, the capacity objects and the
				// StorageClasses they are per
				cluster("create", "authentication.k8s.io", "tokenreviews"),
				local("list", "discovery.k8s.io", "endpointslices"), local("watch", "discovery.k8s.io", "endpointslices"),
				local("create", "", "secrets"), named(local("get", "", "secrets"), ca), named(local("update", "", "secrets"), ca),
				local("create", "", "configmaps"), named(local("get", "", "configmaps"), ca), named(local("update", "", "configmaps"), ca),
				local("get", "storage.k8s.io", "csistoragecapacities"), local("list", "storage.k8s.io", "csistoragecapacities"),
				local("watch", "storage.k8s.io", "csistoragecapacities"), local("create", "storage.k8s.io", "csistoragecapacities"),
				local("update", "storage.k8s.io", "csistoragecapacities"), local("delete", "storage.k8s.io", "csistoragecapacities"),
				cluster("list", "storage.k8s.io", "storageclasses"), cluster("watch", "storage.k8s.io", "storageclasses"),
				// carve controller's placement of restores and clones: the
				// claims it selects a node for, the snapshots it follows,
				// the pending pods and the nodes they could run on
				in("default", "patch", "", "persistentvolumeclaims"),
				cluster("list", "", "pods"), cluster("watch", "", "pods"),
				in("default", "list", "snapshot.storage.k8s.io", "volumesnapshots"),
				in("default", "watch", "snapshot.storage.k8s.io", "volumesnapshots"),
				// csi-provisioner
				cluster("get", "", "persistentvolumes"), cluster("create", "", "persistentvolumes"),
				in("default", "list", "", "persistentvolumeclaims"), in("default", "watch", "", "persistentvolumeclaims"),
				in("default", "update", "", "persistentvolumeclaims"),
				cluster("get", "storage.k8s.io", "storageclasses"), cluster("get", "storage.k8s.io", "csinodes"),
				cluster("list", "storage.k8s.io", "csinodes"), cluster("watch", "storage.k8s.io", "csinodes"),
				in("default", "get", "snapshot.storage.k8s.io", "volumesnapshots"),
				cluster("get", "snapshot.storage.k8s.io", "volumesnapshotcontents"),
				// csi-snapshotter
				cluster("list", "snapshot.storage.k8s.io", "volumesnapshotclasses"),
				cluster("watch", "snapshot.storage.k8s.io", "volumesnapshotclasses"),
				cluster("list", "snapshot.storage.k8s.io", "volumesnapshotcontents"),
				cluster("watch", "snapshot.storage.k8s.io", "volumesnapshotcontents"),
				cluster("update", "snapshot.storage.k8s.io", "volumesnapshotcontents"),
				cluster("patch", "snapshot.storage.k8s.io", "volumesnapshotcontents"),
				sub(cluster("update", "snapshot.storage.k8s.io", "volumesnapshotcontents"), "status"),
				sub(cluster("patch", "snapshot.storage.k8s.io", "volumesnapshotcontents"), "status"),
				// csi-resizer
				cluster("patch", "", "persistentvolumes"), sub(in("default", "patch", "", "persistentvolumeclaims"), "status"),
				// carve controller's mover (kubectl carve move): the claim
				// deleted and made again, the pods that use it stopped
				in("default", "create", "", "persistentvolumeclaims"), in("default", "delete", "", "persistentvolumeclaims"),
				in("default", "list", "", "pods"), in("default", "delete", "", "pods"),
			},
			denied: []access{
				cluster("delete", "", "nodes"), cluster("patch", "", "nodes"),
				in("default", "create", "", "pods"), in("default", "update", "", "pods"), in("default", "patch", "", "pods"),
				local("get", "", "secrets"), local("list", "", "secrets"), named(local("get", "", "secrets"), "other"),
				named(local("update", "", "secrets"), "other"),
				named(local("update", "", "configmaps"), "other"),
				in("default", "create", "storage.k8s.io", "csistoragecapacities"),
				in("kube-system", "create", "coordination.k8s.io", "leases"),
			}},
	}
	for _, tc := range tests {
		user := "system:serviceaccount:" + ns + ":" + tc.sa
		groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
		check := func(a access, want bool) {
			t.Helper()
			r, err := bed.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: a.namespace, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Name: a.name}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status.Allowed != want {
				t.Errorf("%s: %s %s/%s/%s %q in %q: allowed %v, want %v (%s)", tc.sa, a.verb, a.group, a.resource, a.subresource, a.name, a.namespace,
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
