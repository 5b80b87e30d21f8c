//go:build hosttest

package host

import (
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// TestSanityControllerHost runs csi-sanity's Identity and Controller specs
// against the real plugin binary on a loop VG with activation off. The
// Node specs need device-mapper, mkfs and mount: the guest tier runs the
// whole suite. Ginkgo allows one suite per process, so this is the host
// tier's only one. sanity's cleanup calls NodeUnstageVolume on every
// volume it made (the plugin advertises STAGE_UNSTAGE), so the Node
// server's idempotent unstage of a never-staged volume is exercised too.
// Snapshots, restores and clones need device-mapper (lvm refuses a
// snapshot with activation off), so their specs are left to the guest
// tier, whose sanity run counts every skip against the capabilities.
func TestSanityControllerHost(t *testing.T) {
	vg := lvmtest.New(t, lvmtest.Options{Size: 2 << 30})
	bin := buildCarve(t)
	dir := t.TempDir()
	p := startPlugin(t, bin, dir, vg, thickConfig(vg.Name))

	cfg := sanity.NewTestConfig()
	cfg.Address = p.Endpoint
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 64 * mib // whole 4 MiB extents
	cfg.IdempotentCount = 2
	sc := sanity.GinkgoTest(&cfg)
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.FocusStrings = []string{`\[Controller Server\]`, `Identity Service`}
	suite.SkipStrings = []string{`[Ss]napshot`, `from an existing source`}
	// RunSpecs fails t when a spec fails; ginkgo prints the counts.
	ginkgo.RunSpecs(t, "carve controller sanity (host)", suite, reporter)
	sc.Finalize()
}
