//go:build guestinner

// Package sanityinner runs inside the qemu guest (test/guest starts it): it
// makes a loop-device volume group, starts the real `carve node` binary on
// it and runs csi-sanity against the plugin's socket, once with a thick and
// once with a thin default device class, then checks the plugin's metrics
// against what ran and against `vgs`.
package sanityinner

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2/types"

	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

var (
	carveBin  = flag.String("carve", "", "path of the carve binary (required)")
	artifacts = flag.String("artifacts", "", "directory for plugin logs and sanity reports (default: a temporary one)")
)

// suiteEnv carries the sanity configuration from TestSanity to the child
// process that runs the Ginkgo suite: Ginkgo runs one suite per process, and
// each device class needs its own.
const suiteEnv = "CARVE_SANITY_SUITE"

const (
	mib        = 1 << 20
	extentSize = 4 * mib
	// Sanity's volumes: a whole number of extents; expansion doubles it.
	volumeSize = 16 * extentSize
	expandSize = 32 * extentSize
	// Sanity holds at most a handful of volumes (of up to twice
	// volumeSize) at once: 2 GiB leaves room for the spare and a pool.
	vgSize   = 2048 * mib
	poolSize = 512 * mib
	nodeName = "guest-node"
)

// suiteParams is what the child needs of the run.
type suiteParams struct {
	Address     string            `json:"address"`
	StagingPath string            `json:"stagingPath"`
	TargetPath  string            `json:"targetPath"`
	Parameters  map[string]string `json:"parameters,omitempty"`
}

// TestSanitySuite is the child: it runs csi-sanity with the parameters in
// suiteEnv. TestSanity starts it; it is not meant to be run directly.
func TestSanitySuite(t *testing.T) {
	raw := os.Getenv(suiteEnv)
	if raw == "" {
		t.Fatalf("%s is not set: this test is the child process of TestSanity", suiteEnv)
	}
	var p suiteParams
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		t.Fatalf("bad %s: %v", suiteEnv, err)
	}
	cfg := sanity.NewTestConfig()
	cfg.Address = p.Address
	cfg.StagingPath = p.StagingPath
	cfg.TargetPath = p.TargetPath
	cfg.TestVolumeSize = volumeSize
	cfg.TestVolumeExpandSize = expandSize
	cfg.TestVolumeParameters = p.Parameters
	cfg.IdempotentCount = 2
	// carve has no ControllerPublish, so the attach-limit spec (which
	// publishes through the controller) cannot apply; NodeGetInfo's
	// max_volumes_per_node is checked by the node tests.
	cfg.TestNodeVolumeAttachLimit = false
	sanity.Test(t, cfg)
}

// classCase is one device-class setup sanity runs against.
type classCase struct {
	name string
	thin bool
}

func TestSanity(t *testing.T) {
	if *carveBin == "" {
		t.Fatal("-carve must name the carve binary")
	}
	if os.Geteuid() != 0 {
		t.Fatal("needs root (LVM, loop devices, mounts): run it in the guest through test/guest")
	}
	ctx := context.Background()
	if err := plugintest.LoopbackUp(ctx); err != nil {
		t.Fatal(err)
	}
	outDir := *artifacts
	if outDir == "" {
		outDir = t.TempDir()
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []classCase{{name: "thick"}, {name: "thin", thin: true}} {
		// Each class has its own volume group and plugin: the two runs go
		// side by side on the guest's two CPUs.
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runClass(t, tc, outDir)
		})
	}
}

func runClass(t *testing.T, tc classCase, outDir string) {
	ctx := context.Background()
	dir := t.TempDir()
	vg := lvmtest.New(t, lvmtest.Options{
		Dir: dir, Name: "sanity-" + tc.name, Size: vgSize, ExtentSize: extentSize, Activation: true,
	})
	vgName := vg.Name
	// The thick class is there in both runs; the thin run makes the thin
	// class the default, so sanity's requests (which name no class) land
	// on it.
	config := fmt.Sprintf(`deviceClasses:
  - name: thick
    volumeGroup: %s
    default: %t
    spare: 64Mi
`, vgName, !tc.thin)
	defaultClass := "thick"
	if tc.thin {
		if err := vg.CreateThinPool(ctx, "pool0", poolSize); err != nil {
			t.Fatal(err)
		}
		config += fmt.Sprintf(`  - name: thin
    volumeGroup: %s
    default: true
    thinPool: pool0
    overprovisionRatio: 4
    spare: 64Mi
`, vgName)
		defaultClass = "thin"
	}
	logPath := filepath.Join(outDir, "plugin-"+tc.name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the plugin's cleanup, so it runs after the plugin stopped.
	t.Cleanup(func() {
		if err := logFile.Close(); err != nil {
			t.Errorf("closing the plugin log %s: %v", logPath, err)
		}
	})
	plugin, err := plugintest.Start(ctx, plugintest.Options{
		Binary: *carveBin, Dir: dir, NodeName: nodeName, Config: config, MaxVolumes: 100,
		Env: vg.Env(), Log: logFile,
	})
	if err != nil {
		t.Fatalf("%v (plugin log: %s)", err, logPath)
	}
	t.Cleanup(func() {
		if err := plugin.Stop(30 * time.Second); err != nil {
			t.Errorf("stopping the plugin: %v (log: %s)", err, logPath)
		}
	})

	reportPath := filepath.Join(outDir, "sanity-"+tc.name+".json")
	start := time.Now()
	childErr := runSuite(ctx, t, suiteParams{
		Address:     plugin.Endpoint,
		StagingPath: filepath.Join(dir, "staging"),
		TargetPath:  filepath.Join(dir, "target"),
	}, reportPath)
	took := time.Since(start)
	counts, err := summarize(reportPath)
	if err != nil {
		t.Fatalf("reading the sanity report: %v (child: %v)", err, childErr)
	}
	counts.print(tc.name, took)
	if childErr != nil {
		t.Errorf("csi-sanity (%s default class) failed: %v", tc.name, childErr)
	}
	if counts.failed > 0 || counts.passed == 0 {
		t.Errorf("csi-sanity (%s default class): %d passed, %d failed", tc.name, counts.passed, counts.failed)
	}
	checkSkips(ctx, t, plugin, counts.skipped)

	checkMetrics(ctx, t, plugin, vg, defaultClass)
	leftovers, err := plugintest.CarveLVs(ctx, vg)
	if err != nil {
		t.Fatal(err)
	}
	if len(leftovers) > 0 {
		t.Errorf("carve LVs left in %s after sanity deleted its volumes: %v", vgName, leftovers)
	}
	if plugin.Exited() {
		t.Errorf("the plugin exited during the run (log: %s)", logPath)
	}
}

// runSuite runs TestSanitySuite in a child process of this test binary.
func runSuite(ctx context.Context, t *testing.T, p suiteParams, reportPath string) error {
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSanitySuite$", "-test.v", "-test.timeout=19m",
		"-ginkgo.no-color", "-ginkgo.json-report="+reportPath)
	cmd.Env = append(os.Environ(), suiteEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// specResult is one spec of the report.
type specResult struct {
	name, message string
}

type sanityCounts struct {
	passed, failed int
	skipped        []specResult
	// pending are the specs csi-sanity itself disables (XIt).
	pending  []specResult
	failures []specResult
}

// summarize reads Ginkgo's JSON report and counts the It specs by state.
func summarize(path string) (sanityCounts, error) {
	var c sanityCounts
	raw, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	var reports []types.Report
	if err := json.Unmarshal(raw, &reports); err != nil {
		return c, err
	}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != types.NodeTypeIt {
				continue
			}
			res := specResult{name: s.FullText(), message: strings.TrimSpace(s.Failure.Message)}
			switch s.State {
			case types.SpecStatePassed:
				c.passed++
			case types.SpecStateSkipped:
				c.skipped = append(c.skipped, res)
			case types.SpecStatePending:
				c.pending = append(c.pending, res)
			default:
				c.failed++
				c.failures = append(c.failures, res)
			}
		}
	}
	return c, nil
}

func (c sanityCounts) print(class string, took time.Duration) {
	fmt.Printf("SANITY %s: %d passed, %d failed, %d skipped, %d pending (%s)\n",
		class, c.passed, c.failed, len(c.skipped), len(c.pending), took.Round(time.Second))
	for _, p := range c.pending {
		fmt.Printf("SANITY %s pending (disabled in csi-sanity itself): %s\n", class, p.name)
	}
	// Skips grouped by reason: most share one.
	byReason := map[string][]string{}
	for _, s := range c.skipped {
		byReason[s.message] = append(byReason[s.message], s.name)
	}
	reasons := make([]string, 0, len(byReason))
	for r := range byReason {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Printf("SANITY %s skipped %d: %q\n", class, len(byReason[r]), r)
		for _, n := range byReason[r] {
			fmt.Printf("    %s\n", n)
		}
	}
	for _, f := range c.failures {
		fmt.Printf("SANITY %s FAILED: %s\n    %s\n", class, f.name, f.message)
	}
}

// skipCapability maps csi-sanity's skip messages to the capability whose
// absence they stand for. A skip for a capability the plugin advertises
// means a spec that should have run did not; a skip not listed here is a
// reason nobody looked at. Both fail the test.
var skipCapability = map[string]string{
	"ControllerPublishVolume not supported":                       "controller:PUBLISH_UNPUBLISH_VOLUME",
	"Controller Publish, UnpublishVolume not supported":           "controller:PUBLISH_UNPUBLISH_VOLUME",
	"ControllerUnpublishVolume not supported":                     "controller:PUBLISH_UNPUBLISH_VOLUME",
	"ControllerPublishVolume.readonly field not supported":        "controller:PUBLISH_READONLY",
	"testnodevolumeattachlimit not enabled":                       "controller:PUBLISH_UNPUBLISH_VOLUME",
	"Snapshot not supported":                                      "controller:CREATE_DELETE_SNAPSHOT",
	"CreateSnapshot not supported":                                "controller:CREATE_DELETE_SNAPSHOT",
	"DeleteSnapshot not supported":                                "controller:CREATE_DELETE_SNAPSHOT",
	"ListSnapshots not supported":                                 "controller:LIST_SNAPSHOTS",
	"GetSnapshot not supported":                                   "controller:GET_SNAPSHOT",
	"SNAPSHOT_ACCESSIBILITY_CONSTRAINTS not supported":            "plugin:SNAPSHOT_ACCESSIBILITY_CONSTRAINTS",
	"Volume Cloning not supported":                                "controller:CLONE_VOLUME",
	"ControllerExpandVolume not supported":                        "controller:EXPAND_VOLUME",
	"Modify volume not supported":                                 "controller:MODIFY_VOLUME",
	"Modify Volume not supported":                                 "controller:MODIFY_VOLUME",
	"ControllerModifyVolume not supported":                        "controller:MODIFY_VOLUME",
	"ControllerGetVolumeHealth not supported":                     "controller:GET_VOLUME_HEALTH",
	"ControllerListVolumeHealth not supported":                    "controller:LIST_VOLUME_HEALTH",
	"GroupControllerService not supported":                        "plugin:GROUP_CONTROLLER_SERVICE",
	"VolumeGroupSnapshots not supported":                          "plugin:GROUP_CONTROLLER_SERVICE",
	"NodeGetVolumeHealth not supported":                           "node:GET_VOLUME_HEALTH",
	"NodeGetStorageHealth not supported":                          "node:GET_STORAGE_HEALTH",
	"Service does not have single node multi writer capability":   "node:SINGLE_NODE_MULTI_WRITER",
	"NodeExpandVolume not supported":                              "node:EXPAND_VOLUME",
	"GetCapacity not supported":                                   "controller:GET_CAPACITY",
	"ListVolumes not supported":                                   "controller:LIST_VOLUMES",
	"CreateVolume not supported":                                  "controller:CREATE_DELETE_VOLUME",
	"DeleteVolume not supported":                                  "controller:CREATE_DELETE_VOLUME",
	"NodeStageVolume not supported":                               "node:STAGE_UNSTAGE_VOLUME",
	"NodeUnstageVolume not supported":                             "node:STAGE_UNSTAGE_VOLUME",
	"NodeGetVolume not supported":                                 "node:GET_VOLUME_STATS",
	"Controller Service not provided: CreateVolume not supported": "plugin:CONTROLLER_SERVICE",
	"Config.IdempotentCount is zero or negative, skip tests":      "config:IdempotentCount",
	"No MaxVolumesPerNode":                                        "node:max_volumes_per_node",
	"Required bytes not supported":                                "controller:CREATE_DELETE_VOLUME",
	"capacity of the volume is unknown":                           "controller:CREATE_DELETE_VOLUME",
	"CreateTargetDir was set, but CheckPath was not. Please update your testing configuration to enable CheckPath.": "config:CheckPath",
}

// advertised reads the plugin's capabilities in skipCapability's terms.
func advertised(ctx context.Context, t *testing.T, p *plugintest.Plugin) map[string]bool {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	have := map[string]bool{}
	pc, err := csi.NewIdentityClient(p.Conn).GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pc.GetCapabilities() {
		if s := c.GetService(); s != nil {
			have["plugin:"+s.GetType().String()] = true
		}
	}
	cc, err := csi.NewControllerClient(p.Conn).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cc.GetCapabilities() {
		have["controller:"+c.GetRpc().GetType().String()] = true
	}
	nc, err := csi.NewNodeClient(p.Conn).NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range nc.GetCapabilities() {
		have["node:"+c.GetRpc().GetType().String()] = true
	}
	// IdempotentCount is 2 and CheckPath is the default one: neither skip
	// may happen, so they count as "advertised".
	have["config:IdempotentCount"] = true
	have["config:CheckPath"] = true
	info, err := csi.NewNodeClient(p.Conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetMaxVolumesPerNode() > 0 {
		have["node:max_volumes_per_node"] = true
	}
	return have
}

// checkSkips fails for every skipped spec whose reason is unknown or names
// a capability the plugin advertises.
func checkSkips(ctx context.Context, t *testing.T, p *plugintest.Plugin, skipped []specResult) {
	have := advertised(ctx, t, p)
	for _, s := range skipped {
		capName, known := skipCapability[s.message]
		switch {
		case !known:
			t.Errorf("spec skipped for a reason this test does not know: %s: %q", s.name, s.message)
		case have[capName]:
			t.Errorf("spec skipped although the plugin advertises %s: %s: %q", capName, s.name, s.message)
		}
	}
}
