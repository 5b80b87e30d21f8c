// Command carve is carve's program; its roles are subcommands:
//
//	carve node        the node agent on every node (Identity, Controller, Node)
//	carve controller  the cluster-wide Identity and Controller the sidecars call
//	carve version     prints the version (so does --version)
//
// Built with -tags nodeagent it is carve-node, without client-go, which
// would double the agent's resident memory (docs/benchmarks.md); files that
// import client-go carry //go:build !nodeagent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	logsapi "k8s.io/component-base/logs/api/v1"
	// The json format of --logging-format.
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// role is one subcommand: its flags and what it runs.
type role struct {
	summary string
	flags   func(fs *flag.FlagSet) (validate func() error, run func(ctx context.Context) error)
	// absent, when set, says why this binary lacks the role; flags is nil then.
	absent string
}

func roles(stdout io.Writer) map[string]role {
	return map[string]role{
		"node": {summary: "the node agent on every node: Identity, Controller and Node for its volume groups",
			flags: func(fs *flag.FlagSet) (func() error, func(context.Context) error) {
				var o NodeOptions
				o.AddFlags(fs)
				return o.Validate, func(ctx context.Context) error { return runNode(ctx, &o) }
			}},
		"controller": controllerRole(),
		"version": {summary: "print the version",
			flags: func(fs *flag.FlagSet) (func() error, func(context.Context) error) {
				return func() error { return nil }, func(context.Context) error {
					_, err := fmt.Fprintf(stdout, "carve %s\n", version.Version)
					return err
				}
			}},
	}
}

// say writes a message for the user to stderr. A failing stderr leaves
// nowhere to report to, and the exit code tells, so the error is dropped
// here, in this one place.
func say(stderr io.Writer, format string, a ...any) {
	_, _ = fmt.Fprintf(stderr, format, a...)
}

// run is main without the exit: 0, 2 for a usage error, 1 when the role
// failed.
func run(args []string, stdout, stderr io.Writer) int {
	rs := roles(stdout)
	usage := func() {
		names := []string{"node", "controller", "version"}
		here := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return rs[n].absent != "" })
		say(stderr, "usage: %s <%s> [flags]; %s <role> -h lists the role's flags\n", program, strings.Join(here, "|"), program)
		for _, n := range names {
			if r := rs[n]; r.absent != "" {
				say(stderr, "  %-10s  %s\n", n, r.absent)
			} else {
				say(stderr, "  %-10s  %s\n", n, r.summary)
			}
		}
	}
	if len(args) == 0 {
		usage()
		return 2
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = []string{"version"}
	}
	r, ok := rs[args[0]]
	if !ok {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			usage()
			return 0
		}
		say(stderr, "%s: unknown role %q\n", program, args[0])
		usage()
		return 2
	}
	if r.absent != "" {
		say(stderr, "%s %s: %s\n", program, args[0], r.absent)
		return 2
	}
	fs := flag.NewFlagSet("carve "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	validate, start := r.flags(fs)
	var logCfg *logsapi.LoggingConfiguration
	var showVersion *bool
	if args[0] != "version" {
		logCfg = logsapi.NewLoggingConfiguration()
		logsapi.AddGoFlags(logCfg, fs)
		showVersion = fs.Bool("version", false, "print the version and exit")
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		say(stderr, "carve %s: unexpected arguments %q\n", args[0], fs.Args())
		return 2
	}
	if showVersion != nil && *showVersion {
		_, start = rs["version"].flags(flag.NewFlagSet("version", flag.ContinueOnError))
	} else {
		err := validate()
		if logCfg != nil {
			err = errors.Join(err, applyLogging(logCfg))
		}
		if err != nil {
			say(stderr, "carve %s: invalid flags:\n%v\n", args[0], err)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := start(ctx); err != nil {
		klog.ErrorS(err, "carve stopped", "role", args[0])
		klog.Flush()
		// Also plainly, as the last line a user sees.
		say(stderr, "carve %s: %v\n", args[0], err)
		return 1
	}
	klog.Flush()
	return 0
}

// logFormats are --logging-format's values (json registered above).
var logFormats = []string{"text", "json"}

func applyLogging(c *logsapi.LoggingConfiguration) error {
	if !slices.Contains(logFormats, c.Format) {
		return fmt.Errorf("--logging-format %q: must be one of %s", c.Format, strings.Join(logFormats, ", "))
	}
	if err := logsapi.ValidateAndApply(c, nil); err != nil {
		return fmt.Errorf("logging flags: %w", err)
	}
	return nil
}
