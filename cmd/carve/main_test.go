package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	logsapi "k8s.io/component-base/logs/api/v1"
)

func TestRunUsageAndVersion(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		code    int
		stdout  string
		stderr  []string
		environ map[string]string
	}{
		{name: "no role", args: nil, code: 2, stderr: []string{"usage: carve"}},
		{name: "unknown role", args: []string{"frobnicate"}, code: 2, stderr: []string{`unknown role "frobnicate"`}},
		{name: "help", args: []string{"--help"}, code: 0, stderr: []string{"node", "controller", "version"}},
		{name: "version", args: []string{"version"}, code: 0, stdout: "carve dev\n"},
		{name: "--version", args: []string{"--version"}, code: 0, stdout: "carve dev\n"},
		{name: "role --version", args: []string{"node", "--version"}, code: 0, stdout: "carve dev\n"},
		{name: "unknown log format", args: []string{"node", "--node-name", "n1", "--logging-format", "yaml"}, code: 2,
			stderr: []string{`--logging-format "yaml": must be one of text, json`}},
		{name: "unknown flag", args: []string{"node", "--frob"}, code: 2, stderr: []string{"flag provided but not defined: -frob"}},
		{name: "role help lists flags", args: []string{"node", "-h"}, code: 0, stderr: []string{"-node-name", "-config", "-max-volumes", "-metrics-address", "-driver-name", "-endpoint",
			"-kubelet-registration-dir", "-kubelet-csi-socket", "-node-channel-address", "-node-channel-ca-file", "-node-channel-token-file"}},
		{name: "controller does not register with a kubelet", args: []string{"controller", "--kubelet-registration-dir", "/registration"}, code: 2, stderr: []string{"not defined: -kubelet-registration-dir"}},
		{name: "controller has no node flags", args: []string{"controller", "--node-name", "x"}, code: 2, stderr: []string{"not defined: -node-name"}},
		{name: "stray argument", args: []string{"node", "--node-name", "n1", "extra"}, code: 2, stderr: []string{`unexpected arguments ["extra"]`}},
		{name: "invalid flags name every problem", args: []string{"node", "--node-name", "", "--endpoint", "tcp://x:1", "--driver-name", "-bad", "--capacity-refresh-interval", "1ms",
			"--kubelet-registration-dir", "registration", "--kubelet-csi-socket", "unix:///csi/csi.sock"}, code: 2,
			stderr: []string{"--node-name: must be set", "--endpoint", "only unix://", "--driver-name \"-bad\"", "--capacity-refresh-interval 1ms",
				"--kubelet-registration-dir \"registration\"", "--kubelet-csi-socket \"unix:///csi/csi.sock\""}},
		{name: "the controller takes the audit's flags", args: []string{"controller", "--audit-interval", "0", "--orphan-grace-period", "1ms"}, code: 2,
			stderr: []string{"--orphan-grace-period 1ms: must be at least 1s"}},
		{name: "missing config file fails the role", args: []string{"node", "--node-name", "n1", "--config", "/nonexistent/carve.yaml", "--endpoint", "unix:///tmp/x.sock"}, code: 1},
	}
	for _, tt := range tests {
		// carve-node (-tags nodeagent) has no controller: each case of a
		// role it lacks is refused, saying where the role is.
		if len(tt.args) > 0 && roles(io.Discard)[tt.args[0]].absent != "" {
			tt.code, tt.stdout, tt.stderr = 2, "", []string{program + " " + tt.args[0] + ": " + roles(io.Discard)[tt.args[0]].absent}
		}
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", "")
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != tt.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tt.code, stderr.String())
			}
			if tt.stdout != "" && stdout.String() != tt.stdout {
				t.Errorf("stdout %q, want %q", stdout.String(), tt.stdout)
			}
			for _, w := range tt.stderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

func TestPluginOptions(t *testing.T) {
	valid := func() NodeOptions {
		return NodeOptions{CommonOptions: CommonOptions{Endpoint: "unix:///csi/csi.sock", DriverName: DefaultDriverName},
			NodeName: "node-1.example", ConfigPath: "/etc/carve/config.yaml", RefreshInterval: time.Minute, LVMTimeout: time.Minute,
			KubeletRegistrationDir: DefaultKubeletRegistrationDir, KubeletCSISocket: DefaultKubeletCSISocket,
			NodeChannel: NodeChannelOptions{CAFile: DefaultNodeChannelCAFile, TokenFile: DefaultNodeChannelTokenFile}}
	}
	tests := []struct {
		name string
		mod  func(o *NodeOptions)
		want string // "" means valid
	}{
		{"defaults", func(*NodeOptions) {}, ""},
		{"metrics on all interfaces", func(o *NodeOptions) { o.MetricsAddress = ":9810" }, ""},
		{"metrics on loopback", func(o *NodeOptions) { o.MetricsAddress = "127.0.0.1:9810" }, ""},
		{"metrics without port", func(o *NodeOptions) { o.MetricsAddress = "127.0.0.1" }, "--metrics-address"},
		{"upper-case node", func(o *NodeOptions) { o.NodeName = "Node1" }, "--node-name"},
		{"long node", func(o *NodeOptions) { o.NodeName = strings.Repeat("a", 254) }, "--node-name"},
		{"no config", func(o *NodeOptions) { o.ConfigPath = "" }, "--config"},
		{"negative max volumes", func(o *NodeOptions) { o.MaxVolumes = -1 }, "--max-volumes"},
		{"short lvm timeout", func(o *NodeOptions) { o.LVMTimeout = time.Millisecond }, "--lvm-timeout"},
		{"long driver name", func(o *NodeOptions) { o.DriverName = strings.Repeat("a", 64) }, "--driver-name"},
		{"no kubelet: registration off", func(o *NodeOptions) { o.KubeletRegistrationDir = "" }, ""},
		{"no kubelet: the CSI socket path is not used", func(o *NodeOptions) { o.KubeletRegistrationDir, o.KubeletCSISocket = "", "" }, ""},
		{"registration dir elsewhere", func(o *NodeOptions) { o.KubeletRegistrationDir = "/var/lib/kubelet/plugins_registry" }, ""},
		{"relative registration dir", func(o *NodeOptions) { o.KubeletRegistrationDir = "registration" }, "--kubelet-registration-dir"},
		{"registration socket too long", func(o *NodeOptions) { o.KubeletRegistrationDir = "/" + strings.Repeat("r", 90) }, "--kubelet-registration-dir"},
		{"longest driver name fits the default dir", func(o *NodeOptions) { o.DriverName = strings.Repeat("a", 63) }, ""},
		{"CSI socket unset while registering", func(o *NodeOptions) { o.KubeletCSISocket = "" }, "--kubelet-csi-socket: must be set"},
		{"CSI socket as a URL", func(o *NodeOptions) { o.KubeletCSISocket = "unix:///var/lib/kubelet/plugins/x/csi.sock" }, "not a URL"},
		{"relative CSI socket", func(o *NodeOptions) { o.KubeletCSISocket = "plugins/csi.sock" }, "--kubelet-csi-socket"},
		{"CSI socket too long", func(o *NodeOptions) { o.KubeletCSISocket = "/" + strings.Repeat("c", 107) }, "--kubelet-csi-socket"},
		{"relative state directory", func(o *NodeOptions) { o.StateDir = "state" }, "--state-dir \"state\": must be an absolute path"},
		{"node channel off: its files are not used", func(o *NodeOptions) { o.NodeChannel.CAFile, o.NodeChannel.TokenFile = "", "ca.crt" }, ""},
		{"node channel on every interface", func(o *NodeOptions) { o.NodeChannel.Address = ":9811" }, ""},
		{"node channel on one address", func(o *NodeOptions) { o.NodeChannel.Address = "10.0.0.7:9811" }, ""},
		{"node channel on IPv6", func(o *NodeOptions) { o.NodeChannel.Address = "[::]:9811" }, ""},
		{"node channel without port", func(o *NodeOptions) { o.NodeChannel.Address = "10.0.0.7" }, "--node-channel-address \"10.0.0.7\": must be host:port"},
		{"node channel with an empty port", func(o *NodeOptions) { o.NodeChannel.Address = "10.0.0.7:" }, "--node-channel-address"},
		{"node channel on port 0", func(o *NodeOptions) { o.NodeChannel.Address = ":0" }, "the port must be a number from 1 to 65535"},
		{"node channel on a named port", func(o *NodeOptions) { o.NodeChannel.Address = ":https" }, "the port must be a number"},
		{"node channel port too large", func(o *NodeOptions) { o.NodeChannel.Address = ":65536" }, "the port must be a number"},
		{"node channel with a relative CA file", func(o *NodeOptions) { o.NodeChannel.Address, o.NodeChannel.CAFile = ":9811", "ca.crt" },
			"--node-channel-ca-file \"ca.crt\": must be an absolute path"},
		{"node channel without a CA file", func(o *NodeOptions) { o.NodeChannel.Address, o.NodeChannel.CAFile = ":9811", "" }, "--node-channel-ca-file"},
		{"node channel with a relative token file", func(o *NodeOptions) { o.NodeChannel.Address, o.NodeChannel.TokenFile = ":9811", "token" },
			"--node-channel-token-file \"token\": must be an absolute path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := valid()
			tt.mod(&o)
			checkValidate(t, o.Validate(), tt.want)
		})
	}
}

func TestNodeNameFromEnvironment(t *testing.T) {
	t.Setenv("NODE_NAME", "from-env")
	var o NodeOptions
	fs := flag.NewFlagSet("carve node", flag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if o.NodeName != "from-env" {
		t.Errorf("NodeName = %q, want the NODE_NAME value", o.NodeName)
	}
	if err := fs.Parse([]string{"--node-name", "from-flag"}); err != nil || o.NodeName != "from-flag" {
		t.Errorf("the flag did not win over the environment: %q, %v", o.NodeName, err)
	}
}

// TestMain runs carve's main instead of the tests when CARVE_TEST_MAIN is
// set, so a test can run the real binary's code in a process of its own
// (the logging configuration applies once per process).
func TestMain(m *testing.M) {
	if os.Getenv("CARVE_TEST_MAIN") == "1" {
		main()
	}
	// In the test process run() is called many times, each applying the
	// same default logging configuration.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
	os.Exit(m.Run())
}

// TestLoggingFormatJSON: --logging-format=json makes every log line a JSON
// object with the message and its key/value pairs (what log pipelines
// parse); the default is klog's text.
func TestLoggingFormatJSON(t *testing.T) {
	for _, tt := range []struct {
		format string
		json   bool
	}{{"json", true}, {"text", false}} {
		t.Run(tt.format, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "node", "--node-name", "n1", "--logging-format", tt.format,
				"--config", "/nonexistent/carve.yaml", "--endpoint", "unix://"+filepath.Join(t.TempDir(), "csi.sock"))
			cmd.Env = append(os.Environ(), "CARVE_TEST_MAIN=1")
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stderr, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Fatalf("carve with a missing config file: %v, want exit code 1; output:\n%s", err, stderr.String())
			}
			var entry map[string]any
			var found bool
			for _, line := range strings.Split(stderr.String(), "\n") {
				if !strings.Contains(line, "carve stopped") {
					continue
				}
				found = true
				err := json.Unmarshal([]byte(line), &entry)
				switch {
				case tt.json && err != nil:
					t.Errorf("log line is not JSON (%v): %s", err, line)
				case tt.json && (entry["msg"] != "carve stopped" || entry["role"] != "node" || !strings.Contains(fmt.Sprint(entry["err"]), "/nonexistent/carve.yaml")):
					t.Errorf("JSON log line lacks msg, role or err: %s", line)
				case !tt.json && err == nil:
					t.Errorf("text log line parses as JSON: %s", line)
				}
			}
			if !found {
				t.Errorf("no \"carve stopped\" log line in:\n%s", stderr.String())
			}
		})
	}
}

// checkValidate fails t unless err is nil when want is empty, or names
// want (a flag) otherwise.
func checkValidate(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("Validate: %v", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Errorf("Validate = %v, want an error about %s", err, want)
	}
}
