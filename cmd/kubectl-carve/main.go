// Command kubectl-carve is a kubectl plugin (`kubectl carve ...`) that
// answers operators' questions about carve from the Kubernetes API alone,
// and asks carve controller to move claims:
//
//	kubectl carve nodes       per node: agent ready or why not, reachable, registered, group, version, free space
//	kubectl carve capacity    per node and device class: reported capacity, volumes there
//	kubectl carve volumes     per volume: PVC, pods, node, volume group, LV, size
//	kubectl carve pending     Pending PVCs of carve's StorageClasses, with their last event
//	kubectl carve snapshots   VolumeSnapshots of carve's driver, with their node
//	kubectl carve describe    everything about one claim
//	kubectl carve orphans     the audit's orphaned LVs, quarantines and PVs whose LV is gone
//	kubectl carve move        move a bound claim to another node and follow it
//	kubectl carve drain       move every carve claim off a node, one at a time
//
// It takes kubectl's client and output flags in any position; completion
// goes through kubectl via kubectl_complete-carve. See docs/operations.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	// The kubeconfig auth providers, as kubectl has them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	"github.com/carve-csi/carve/internal/kubectl/view"
)

// Exit codes: a usage error is 2, like the shells' builtins; a failed read
// is 1.
const (
	exitUsage = 2
	exitError = 1
)

func main() {
	os.Exit(run(os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}, connect))
}

// clients are what the views read the API with.
type clients struct {
	kube    kubernetes.Interface
	dynamic dynamic.Interface
}

// connect makes the clients from kubectl's flags.
func connect(getter genericclioptions.RESTClientGetter) (clients, error) {
	cfg, err := getter.ToRESTConfig()
	if err != nil {
		return clients{}, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return clients{}, fmt.Errorf("client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return clients{}, fmt.Errorf("client: %w", err)
	}
	return clients{kube: kube, dynamic: dyn}, nil
}

// usageError is a command line kubectl carve cannot run.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func run(args []string, streams genericiooptions.IOStreams, conn func(genericclioptions.RESTClientGetter) (clients, error)) int {
	return runAt(args, streams, conn, time.Now())
}

func runAt(args []string, streams genericiooptions.IOStreams, conn func(genericclioptions.RESTClientGetter) (clients, error), now time.Time) int {
	config := genericclioptions.NewConfigFlags(true)
	*config.Timeout = "30s" // kubectl waits forever; carve's views read a few lists
	o := &options{config: config, streams: streams, connect: conn, now: func() time.Time { return now }}
	root := o.command()
	root.SetArgs(args)
	ran := false // a command's RunE started: its error is not a usage error
	for _, c := range root.Commands() {
		if c.RunE == nil {
			continue
		}
		runE := c.RunE
		c.RunE = func(cmd *cobra.Command, args []string) error {
			ran = true
			return runE(cmd, args)
		}
	}
	err := root.Execute()
	if err == nil {
		return 0
	}
	say(streams.ErrOut, "error: %v\n", err)
	var ue usageError
	if !ran || errors.As(err, &ue) {
		say(streams.ErrOut, "See 'kubectl carve --help' for usage.\n")
		return exitUsage
	}
	return exitError
}

// options are the flags every command shares.
type options struct {
	config        *genericclioptions.ConfigFlags
	allNamespaces bool
	output        string
	noHeaders     bool
	driver        string
	agentService  string

	streams genericiooptions.IOStreams
	connect func(genericclioptions.RESTClientGetter) (clients, error)
	now     func() time.Time
}

func (o *options) command() *cobra.Command {
	root := &cobra.Command{
		Use:   "kubectl-carve",
		Short: "Ask the Kubernetes API about carve: nodes, capacity, volumes, claims, snapshots",
		Long: `kubectl carve shows carve (the LVM CSI driver) as the Kubernetes API sees it.
It reads the API only, with kubectl's flags and rights: a user with rights in
one namespace sees that namespace's volumes, claims and snapshots.`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl carve"},
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(o.streams.ErrOut)
			_ = cmd.Usage()
			return usageError{errors.New("name a command")}
		},
		PersistentPreRunE: func(*cobra.Command, []string) error { return o.validate() },
	}
	root.SetIn(o.streams.In)
	root.SetOut(o.streams.Out)
	root.SetErr(o.streams.ErrOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	flags := root.PersistentFlags()
	o.config.AddFlags(flags)
	flags.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false,
		"list the volumes, claims and snapshots of every namespace, not only the current one")
	flags.StringVarP(&o.output, "output", "o", "table", "output format: table, wide, json, yaml or name")
	flags.BoolVar(&o.noHeaders, "no-headers", false, "print tables without their header")
	flags.StringVar(&o.driver, "driver", "lvm.carve.dev", "carve's CSI driver name")
	flags.StringVar(&o.agentService, "agent-service", "carve-node", "the Service over carve's node agents (<nameOverride>-node for a chart installed with nameOverride)")
	o.registerCompletions(root)

	for _, v := range o.views() {
		root.AddCommand(v)
	}
	return root
}

func (o *options) validate() error {
	switch o.output {
	case "table", "wide", "json", "yaml", "name":
		return nil
	}
	return usageError{fmt.Errorf("--output %q: must be one of table, wide, json, yaml, name", o.output)}
}

// view builds a command's view: namespaced views read -n (or the context's
// namespace), all of them with -A.
func (o *options) view() (view.View, error) {
	c, err := o.connect(o.config)
	if err != nil {
		return view.View{}, err
	}
	v := view.View{Client: c.kube, Dynamic: c.dynamic, Driver: o.driver, AgentService: o.agentService,
		Warn: func(msg string) { say(o.streams.ErrOut, "Warning: %s\n", msg) }}
	if !o.allNamespaces {
		ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
		if err != nil {
			return view.View{}, fmt.Errorf("the current namespace: %w", err)
		}
		v.Namespace = ns
	}
	return v, nil
}

// ctx is a command's context; --request-timeout bounds each request.
func ctx(cmd *cobra.Command) context.Context {
	if c := cmd.Context(); c != nil {
		return c
	}
	return context.Background()
}

// say writes a message for the user; a failed write has nowhere to go.
func say(w io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(w, format, args...)
}
