package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/kubectl/view"
)

func (o *options) describeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "describe CLAIM",
		Short: "Everything about one claim: PV, LV, node, class, pods, events, metrics",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("describe takes one claim name, got %d", len(args))}
			}
			return nil
		},
		ValidArgsFunction: o.completeClaims,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.allNamespaces {
				return usageError{fmt.Errorf("describe reads one claim: name its namespace with -n, not -A")}
			}
			v, err := o.view()
			if err != nil {
				return err
			}
			c, err := v.Describe(ctx(cmd), args[0])
			if err != nil {
				return err
			}
			switch o.output {
			case "json", "yaml", "name":
				return o.print(listing{rows: c, names: []string{"persistentvolumeclaim/" + c.Name}}, "")
			}
			return describe(o.streams.Out, c, o.now())
		},
	}
}

// describe writes c as kubectl describe writes an object: aligned
// "Field:  value" lines, then the events.
func describe(out io.Writer, c *view.Claim, now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	line := func(indent int, format string, args ...any) {
		_, _ = fmt.Fprintf(w, strings.Repeat("  ", indent)+format+"\n", args...)
	}
	line(0, "Name:\t%s", c.Name)
	line(0, "Namespace:\t%s", c.Namespace)
	line(0, "Status:\t%s", c.Phase)
	line(0, "StorageClass:\t%s", orNone(c.StorageClass))
	line(0, "Device Class:\t%s", orNone(c.DeviceClass))
	capacity := none
	if c.SizeBytes != 0 {
		capacity = size(c.SizeBytes)
	}
	line(0, "Capacity:\t%s", capacity)
	if c.Requested != 0 {
		line(0, "Requested:\t%s", size(c.Requested))
	}
	line(0, "Access Modes:\t%s", orNone(strings.Join(c.AccessModes, ",")))
	line(0, "Volume Mode:\t%s", orNone(c.VolumeMode))
	var pods []string // as kubectl describe pvc: names in the claim's namespace
	for _, p := range c.Pods {
		pods = append(pods, strings.TrimPrefix(p, c.Namespace+"/"))
	}
	line(0, "Used By:\t%s", orNone(strings.Join(pods, ",")))
	line(0, "Attributes Class:\t%s", orNone(c.AttributesClass))
	if c.Modify != "" {
		line(1, "Modify:\t%s", c.Modify)
	}
	line(0, "IO Limits:\t%s", orNone(attributes(c.IOLimits)))
	encryption := orNone(c.Encryption)
	if c.KeyID != "" {
		encryption += " (key ID " + c.KeyID + ")"
	}
	line(0, "Encryption:\t%s", encryption)
	line(0, "Node:\t%s", orNone(c.Node))
	if c.SelectedNode != "" && c.SelectedNode != c.Node {
		line(0, "Selected Node:\t%s", c.SelectedNode)
	}
	line(0, "Age:\t%s", age(now, c.Created))
	line(0, "Volume:\t%s", orNone(c.PV))
	if c.PV != "" {
		line(1, "Status:\t%s", orNone(c.PVPhase))
		line(1, "Reclaim Policy:\t%s", orNone(c.Reclaim))
		line(1, "Volume Handle:\t%s", orNone(c.VolumeHandle))
		line(1, "Volume Group:\t%s", orNone(c.VolumeGroup))
		line(1, "LV:\t%s", orNone(c.LV))
		line(1, "FS Type:\t%s", orNone(c.FSType))
		line(1, "Attributes:\t%s", orNone(attributes(c.Attributes)))
	}
	line(0, "Metrics:")
	for _, m := range c.Metrics {
		line(1, "%s", m)
	}
	if len(c.Events) == 0 {
		line(0, "Events:\t%s", none)
		return w.Flush()
	}
	line(0, "Events:")
	line(1, "Type\tReason\tAge\tFrom\tObject\tMessage")
	line(1, "----\t------\t----\t----\t------\t-------")
	for _, e := range c.Events {
		line(1, "%s\t%s\t%s\t%s\t%s\t%s", e.Type, e.Reason, age(now, e.LastSeen), orNone(e.From), e.Object, e.Message)
	}
	return w.Flush()
}

// attributes prints a PV's volume attributes as k=v, sorted.
func attributes(a map[string]string) string {
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		kv = append(kv, k+"="+a[k])
	}
	return strings.Join(kv, ",")
}

// completeClaims completes describe's argument with the claims of the
// current namespace.
func (o *options) completeClaims(cmd *cobra.Command, args []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	v, err := o.view()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	list, err := v.Client.CoreV1().PersistentVolumeClaims(v.Namespace).List(ctx(cmd), metav1.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	return completeNames(list.Items, prefix)
}

// completeNames completes prefix with the names of objs.
func completeNames[T any, P interface {
	*T
	GetName() string
}](objs []T, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	var out []cobra.Completion
	for i := range objs {
		if name := P(&objs[i]).GetName(); strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// registerCompletions completes the flags whose values the API or the
// kubeconfig knows: -n, --context, --cluster, --user, -o.
func (o *options) registerCompletions(root *cobra.Command) {
	fixed := func(values ...string) cobra.CompletionFunc {
		return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
	}
	_ = root.RegisterFlagCompletionFunc("output", fixed("table", "wide", "json", "yaml", "name"))
	_ = root.RegisterFlagCompletionFunc("namespace", func(cmd *cobra.Command, _ []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
		c, err := o.connect(o.config)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		list, err := c.kube.CoreV1().Namespaces().List(ctx(cmd), metav1.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		return completeNames(list.Items, prefix)
	})
	for flag, pick := range map[string]func(cfgContexts, cfgClusters, cfgUsers []string) []string{
		"context": func(x, _, _ []string) []string { return x },
		"cluster": func(_, x, _ []string) []string { return x },
		"user":    func(_, _, x []string) []string { return x },
	} {
		_ = root.RegisterFlagCompletionFunc(flag, func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
			raw, err := o.config.ToRawKubeConfigLoader().RawConfig()
			if err != nil {
				return nil, cobra.ShellCompDirectiveError
			}
			return pick(slices.Sorted(maps.Keys(raw.Contexts)), slices.Sorted(maps.Keys(raw.Clusters)),
				slices.Sorted(maps.Keys(raw.AuthInfos))), cobra.ShellCompDirectiveNoFileComp
		})
	}
}
