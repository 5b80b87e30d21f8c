package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/pkg/kubeview"
)

// TestUsageErrors: wrong commands and flags exit 2 and say what is allowed,
// before any kubeconfig is read.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: kubectl carve <capacity|volumes|pending|orphans>"},
		{[]string{"-o", "json"}, "usage:"},
		{[]string{"nodes"}, `unknown command "nodes"`},
		{[]string{"volumes", "-o", "yaml"}, `-o "yaml": must be table or json`},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
			t.Errorf("run(%q) = %d, stderr %q, stdout %q; want 2 and %q", tc.args, code, stderr.String(), stdout.String(), tc.want)
		}
	}
}

// TestPendingTable: one aligned row per claim, the last event as
// "reason: message", "-" for what is unknown.
func TestPendingTable(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	err := pendingTable(&out, []kubeview.Pending{
		{Claim: "web/waiting", StorageClass: "carve-thick", SelectedNode: "n2", Pods: []string{"web/w"}, Since: now.Add(-90 * time.Second),
			Reason: "ProvisioningFailed", Message: "no room"},
		{Claim: "web/unused", StorageClass: "carve-thin", Since: now.Add(-time.Hour)},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	want := "PVC          STORAGECLASS  AGE     SELECTED NODE  PODS   LAST EVENT\n" +
		"web/waiting  carve-thick   1m30s   n2             web/w  ProvisioningFailed: no room\n" +
		"web/unused   carve-thin    1h0m0s  -              -      -\n"
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
}
