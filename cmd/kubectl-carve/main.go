// Command kubectl-carve is a kubectl plugin (`kubectl carve ...`) that
// answers operators' questions about carve from the Kubernetes API alone:
//
//	kubectl carve capacity   per node and device class: the capacity carve reports, its volumes there
//	kubectl carve volumes    per volume: PVC, pods, node, volume group, LV, size
//	kubectl carve pending    PVCs of carve's StorageClasses that are Pending, with their last event
//	kubectl carve orphans    what the node audit reported: orphaned LVs, PVs whose LV is gone
//
// -o json prints the same as JSON. See docs/operations.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/carve-csi/carve/pkg/kubeview"
)

const usage = `usage: kubectl carve <capacity|volumes|pending|orphans> [-o table|json] [--kubeconfig FILE] [--context NAME] [--driver NAME]`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		say(stderr, "%s\n", usage)
		return 2
	}
	cmd := args[0]
	fs := flag.NewFlagSet("kubectl carve "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.String("o", "table", "output: table or json")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
	kubeContext := fs.String("context", "", "kubeconfig context (default: the current one)")
	driver := fs.String("driver", "lvm.carve.dev", "carve's CSI driver name")
	timeout := fs.Duration("request-timeout", 30*time.Second, "bound on all API requests")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if cmd != "capacity" && cmd != "volumes" && cmd != "pending" && cmd != "orphans" {
		say(stderr, "unknown command %q\n%s\n", cmd, usage)
		return 2
	}
	if *output != "table" && *output != "json" {
		say(stderr, "-o %q: must be table or json\n", *output)
		return 2
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: *kubeContext}).ClientConfig()
	if err != nil {
		say(stderr, "kubeconfig: %v\n", err)
		return 1
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		say(stderr, "client: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	v := kubeview.View{Client: cs, Driver: *driver}
	var result any
	var table func(w io.Writer) error
	switch cmd {
	case "capacity":
		rows, err := v.Capacities(ctx)
		result, table = rows, func(w io.Writer) error { return capacityTable(w, rows) }
		if err != nil {
			return fail(stderr, err)
		}
	case "volumes":
		rows, err := v.Volumes(ctx)
		result, table = rows, func(w io.Writer) error { return volumeTable(w, rows) }
		if err != nil {
			return fail(stderr, err)
		}
	case "pending":
		rows, err := v.PendingClaims(ctx)
		result, table = rows, func(w io.Writer) error { return pendingTable(w, rows, time.Now()) }
		if err != nil {
			return fail(stderr, err)
		}
	default: // orphans
		rows, err := v.Findings(ctx)
		result, table = rows, func(w io.Writer) error { return findingTable(w, rows, time.Now()) }
		if err != nil {
			return fail(stderr, err)
		}
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(result); err != nil {
			return fail(stderr, err)
		}
		return 0
	}
	if err := table(stdout); err != nil {
		return fail(stderr, err)
	}
	return 0
}

func fail(stderr io.Writer, err error) int {
	say(stderr, "%v\n", err)
	return 1
}

// say writes a message for the user; a failed write has nowhere to go.
func say(w io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(w, format, args...)
}

func size(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// table writes aligned columns and keeps the first write error.
type table struct {
	tw  *tabwriter.Writer
	err error
}

func newTable(out io.Writer) *table { return &table{tw: tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)} }

func (t *table) row(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.tw, format+"\n", args...)
	}
}

func (t *table) flush() error {
	if t.err != nil {
		return t.err
	}
	return t.tw.Flush()
}

func capacityTable(out io.Writer, rows []kubeview.Capacity) error {
	w := newTable(out)
	w.row("NODE\tDEVICE CLASS\tSTORAGECLASS\tCAPACITY\tMAX VOLUME\tVOLUMES\tPROVISIONED")
	for _, r := range rows {
		w.row("%s\t%s\t%s\t%s\t%s\t%d\t%s", r.Node, orDash(r.DeviceClass), r.StorageClass,
			size(r.CapacityBytes), size(r.MaximumVolumeSize), r.Volumes, size(r.ProvisionedBytes))
	}
	return w.flush()
}

func volumeTable(out io.Writer, rows []kubeview.Volume) error {
	w := newTable(out)
	w.row("NODE\tPV\tPVC\tPODS\tDEVICE CLASS\tLV\tSIZE\tSTATUS")
	for _, r := range rows {
		w.row("%s\t%s\t%s\t%s\t%s\t%s/%s\t%s\t%s", r.Node, r.PV, orDash(r.Claim),
			orDash(strings.Join(r.Pods, ",")), orDash(r.DeviceClass), r.VolumeGroup, r.LV, size(r.SizeBytes), r.Phase)
	}
	return w.flush()
}

func pendingTable(out io.Writer, rows []kubeview.Pending, now time.Time) error {
	w := newTable(out)
	w.row("PVC\tSTORAGECLASS\tAGE\tSELECTED NODE\tPODS\tLAST EVENT")
	for _, r := range rows {
		event := "-"
		if r.Reason != "" {
			event = r.Reason + ": " + r.Message
		}
		w.row("%s\t%s\t%s\t%s\t%s\t%s", r.Claim, r.StorageClass, now.Sub(r.Since).Round(time.Second),
			orDash(r.SelectedNode), orDash(strings.Join(r.Pods, ",")), event)
	}
	return w.flush()
}

func findingTable(out io.Writer, rows []kubeview.Finding, now time.Time) error {
	w := newTable(out)
	w.row("KIND\tOBJECT\tLAST SEEN\tCOUNT\tMESSAGE")
	for _, r := range rows {
		w.row("%s\t%s\t%s ago\t%d\t%s", r.Kind, r.Object, now.Sub(r.LastSeen).Round(time.Second), r.Count, r.Message)
	}
	return w.flush()
}
