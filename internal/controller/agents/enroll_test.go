package agents

import (
	"errors"
	"strings"
	"testing"

	authv1 "k8s.io/api/authentication/v1"
)

// TestCheckReview covers the cases TestEnrollment does not reach through
// an agent: which side may lack a pod UID, and extras with several values.
func TestCheckReview(t *testing.T) {
	ep := endpoint{Node: "node-a", Pod: "pod-a", UID: "uid-a", Addr: "10.0.0.1:7443"}
	user := "system:serviceaccount:" + testNS + ":" + testSA
	tests := []struct {
		name    string
		ep      endpoint
		edit    func(*authv1.TokenReviewStatus)
		wantErr string
	}{
		{name: "matches", ep: ep},
		{name: "endpoint without a UID", ep: endpoint{Node: "node-a", Pod: "pod-a"}},
		{name: "token without a UID", ep: ep, edit: func(st *authv1.TokenReviewStatus) { delete(st.User.Extra, extraPodUID) }},
		{name: "token bound to no pod", ep: ep, edit: func(st *authv1.TokenReviewStatus) { delete(st.User.Extra, extraPodName) },
			wantErr: `token bound to pod "", the endpoint is pod "pod-a"`},
		{name: "two node names", ep: ep, edit: func(st *authv1.TokenReviewStatus) { st.User.Extra[extraNodeName] = []string{"node-a", "node-b"} },
			wantErr: `token's pod is on node "node-a,node-b"`},
		{name: "another namespace's service account", ep: ep,
			edit:    func(st *authv1.TokenReviewStatus) { st.User.Username = "system:serviceaccount:other:" + testSA },
			wantErr: `token of "system:serviceaccount:other:carve-node"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := goodReview("node-a", "pod-a", "uid-a")
			if tt.edit != nil {
				tt.edit(&st)
			}
			err := checkReview(st, user, testAudience, tt.ep, "node-a")
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("checkReview: %v, want nil", err)
			case tt.wantErr != "" && (!errors.Is(err, errRefused) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("checkReview: %v, want a refusal naming %q", err, tt.wantErr)
			}
		})
	}
}
