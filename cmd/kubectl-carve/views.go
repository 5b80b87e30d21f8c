package main

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/kubectl/view"
)

// views are kubectl carve's commands.
func (o *options) views() []*cobra.Command {
	return append([]*cobra.Command{
		o.listCommand("nodes", "Each node's carve agent: ready or why not, registered, group, version, free space",
			false, o.nodes),
		o.listCommand("capacity", "Per node and StorageClass: the capacity carve reports, its volumes there",
			false, o.capacity),
		o.listCommand("volumes", "carve's volumes (current namespace; -A: all): claim, PV, node, LV, size, pods",
			true, o.volumes),
		o.listCommand("pending", "Pending claims of carve's classes (current namespace; -A: all), last event",
			true, o.pending),
		o.listCommand("snapshots", "carve's VolumeSnapshots (current namespace; -A: all), with their node",
			true, o.snapshots),
		o.listCommand("orphans", "What the audit reported: orphaned LVs and their quarantines, PVs whose LV is gone",
			false, o.orphans),
		o.describeCommand(),
	}, o.moveCommands()...)
}

// listCommand is a view that lists rows; namespaced ones read the current
// namespace unless -A.
func (o *options) listCommand(name, short string, namespaced bool, list func(*cobra.Command, view.View) (listing, error)) *cobra.Command {
	return &cobra.Command{
		Use:   name,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := o.view()
			if err != nil {
				return err
			}
			if !namespaced {
				v.Namespace = ""
			}
			l, err := list(cmd, v)
			if err != nil {
				return err
			}
			return o.print(l, v.Namespace)
		},
	}
}

func (o *options) nodes(cmd *cobra.Command, v view.View) (listing, error) {
	rows, err := v.Nodes(ctx(cmd))
	if err != nil {
		return listing{}, err
	}
	now := o.now()
	l := listing{rows: rows, columns: []metav1.TableColumnDefinition{
		col("Node"), col("Agent"), col("Channel"), col("Registered"), col("Group"), col("Version"), col("Free"),
		col("Age"), wideCol("Pod"), col("Reason")}}
	for _, r := range rows {
		registered := "no"
		if r.Registered {
			registered = "yes"
		}
		var free []string
		for _, class := range slices.Sorted(maps.Keys(r.Free)) {
			free = append(free, class+"="+size(r.Free[class]))
		}
		l.names = append(l.names, "node/"+r.Node)
		l.cells = append(l.cells, []any{r.Node, r.Agent, r.Channel, registered, orNone(r.Group), orNone(r.Version),
			orNone(strings.Join(free, ",")), age(now, r.Created), orNone(r.Pod), orNone(r.Reason)})
	}
	return l, nil
}

func (o *options) capacity(cmd *cobra.Command, v view.View) (listing, error) {
	rows, err := v.Capacities(ctx(cmd))
	if err != nil {
		return listing{}, err
	}
	l := listing{rows: rows, columns: []metav1.TableColumnDefinition{
		col("Node"), col("Device Class"), col("StorageClass"), col("Capacity"), col("Max Volume"), col("Volumes"),
		col("Provisioned"), wideCol("CSIStorageCapacity")}}
	for _, r := range rows {
		l.names = append(l.names, "csistoragecapacity.storage.k8s.io/"+r.Name)
		l.cells = append(l.cells, []any{r.Node, orNone(r.DeviceClass), r.StorageClass, size(r.CapacityBytes),
			size(r.MaximumVolumeSize), r.Volumes, size(r.ProvisionedBytes), r.Name})
	}
	return l, nil
}

func (o *options) volumes(cmd *cobra.Command, v view.View) (listing, error) {
	rows, err := v.Volumes(ctx(cmd))
	if err != nil {
		return listing{}, err
	}
	now := o.now()
	l := listing{rows: rows, namespaces: []string{}, columns: []metav1.TableColumnDefinition{
		col("PVC"), col("PV"), col("Node"), col("Device Class"), col("LV"), col("Size"), col("Status"), col("Pods"),
		col("Age"), wideCol("StorageClass")}}
	for _, r := range rows {
		ns, claim, _ := strings.Cut(r.Claim, "/")
		lv := r.LV
		if r.VolumeGroup != "" {
			lv = r.VolumeGroup + "/" + r.LV
		}
		var pods []string
		for _, p := range r.Pods {
			pods = append(pods, strings.TrimPrefix(p, ns+"/"))
		}
		l.names = append(l.names, "persistentvolume/"+r.PV)
		l.namespaces = append(l.namespaces, orNone(ns))
		l.cells = append(l.cells, []any{orNone(claim), r.PV, orNone(r.Node), orNone(r.DeviceClass), orNone(lv),
			size(r.SizeBytes), r.Phase, orNone(strings.Join(pods, ",")), age(now, r.Created), orNone(r.StorageClass)})
	}
	return l, nil
}

func (o *options) pending(cmd *cobra.Command, v view.View) (listing, error) {
	rows, err := v.PendingClaims(ctx(cmd))
	if err != nil {
		return listing{}, err
	}
	return pendingListing(rows, o.now()), nil
}

// pendingListing is the pending view's listing at time now.
func pendingListing(rows []view.Pending, now time.Time) listing {
	l := listing{rows: rows, namespaces: []string{}, columns: []metav1.TableColumnDefinition{
		col("PVC"), col("StorageClass"), col("Age"), col("Selected Node"), col("Pods"), col("Last Event")}}
	for _, r := range rows {
		ns, claim, _ := strings.Cut(r.Claim, "/")
		var pods []string
		for _, p := range r.Pods {
			pods = append(pods, strings.TrimPrefix(p, ns+"/"))
		}
		event := none
		if r.Reason != "" {
			event = r.Reason + ": " + r.Message
		}
		l.names = append(l.names, "persistentvolumeclaim/"+claim)
		l.namespaces = append(l.namespaces, ns)
		l.cells = append(l.cells, []any{claim, r.StorageClass, age(now, r.Since), orNone(r.SelectedNode),
			orNone(strings.Join(pods, ",")), event})
	}
	return l
}

func (o *options) snapshots(cmd *cobra.Command, v view.View) (listing, error) {
	rows, err := v.Snapshots(ctx(cmd))
	if err != nil {
		return listing{}, err
	}
	now := o.now()
	l := listing{rows: rows, namespaces: []string{}, columns: []metav1.TableColumnDefinition{
		col("Name"), col("Source PVC"), col("Node"), col("Ready"), col("Restore Size"), col("Class"), col("Age"),
		wideCol("Content"), wideCol("LV"), wideCol("Error")}}
	for _, r := range rows {
		lv := ""
		if r.LV != "" {
			lv = r.VolumeGroup + "/" + r.LV
		}
		l.names = append(l.names, "volumesnapshot.snapshot.storage.k8s.io/"+r.Name)
		l.namespaces = append(l.namespaces, r.Namespace)
		l.cells = append(l.cells, []any{r.Name, orNone(r.SourceClaim), orNone(r.Node), r.ReadyToUse, size(r.SizeBytes),
			orNone(r.Class), age(now, r.Created), orNone(r.Content), orNone(lv), orNone(r.Error)})
	}
	return l, nil
}

func (o *options) orphans(cmd *cobra.Command, v view.View) (listing, error) {
	rows, err := v.Findings(ctx(cmd))
	if err != nil {
		return listing{}, err
	}
	now := o.now()
	l := listing{rows: rows, columns: []metav1.TableColumnDefinition{
		col("Kind"), col("Object"), col("Last Seen"), col("Count"), col("Message")}}
	for _, r := range rows {
		l.names = append(l.names, r.Object)
		l.cells = append(l.cells, []any{r.Kind, r.Object, age(now, r.LastSeen), r.Count, r.Message})
	}
	return l, nil
}
