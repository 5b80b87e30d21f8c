//go:build nodes

package nodes

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/promcheck"
)

// TestPrometheus: the Prometheus server of the e2e tier's TestPrometheus
// scrapes what the chart's ServiceMonitor scrapes on this bed (every pod
// behind carve's metrics Services, through port forwards), and once
// real-1 has a thin volume and a thick snapshot, every dashboard query and
// alert expression part that the e2e bed excuses for lack of
// device-mapper (promcheck.DeviceMapperSeries: thin pool data, metadata
// and zeroing, thick snapshot copy-on-write use and invalid) returns
// series, as does each of those series itself.
//
// It is not parallel: Go runs it then in file order, before the tests
// that stop the controller's leader (TestLeaderTakeover: its thawed
// sidecars exit and restart later) or reboot the node, whose targets
// would be down while it waits for every one to be up.
func TestPrometheus(t *testing.T) {
	bin, err := promcheck.Server()
	if err != nil {
		t.Fatal(err)
	}
	qs, err := promcheck.Shipped(filepath.Join("..", "..", "deploy"))
	if err != nil {
		t.Error(err)
	}
	dm := promcheck.DeviceMapperSeries()
	var want []promcheck.Query
	for _, q := range qs {
		ok, err := promcheck.Selects(q.Expr, dm)
		if err != nil {
			t.Errorf("%s: %v", q.Where, err)
		}
		if ok {
			want = append(want, q)
		}
	}
	for _, m := range dm {
		want = append(want, promcheck.Query{Where: "series " + m.Selector, Expr: m.Selector})
	}
	if len(want) == len(dm) {
		t.Fatal("no dashboard query or alert expression selects a device-mapper series")
	}

	ctx := testCtx(t, 10*time.Minute)
	ns := newNamespace(t, "prom")
	createClaimAndPod(t, newPVC(ns, "thin", thinSC, "256Mi"), newPod(ns, "thin", "thin", false, sleeper))
	createClaimAndPod(t, newPVC(ns, "thick", thickSC, "256Mi"), newPod(ns, "thick", "thick", false, sleeper))
	dc := dynamicClient(t)
	createSnapshotReady(t, ctx, dc, ns, "snap", "thick")
	driven := time.Now()

	targets, stop, err := bed.PodScrapeTargets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	jobs := map[string]int{}
	for _, tg := range targets {
		jobs[tg.Job]++
	}
	t.Logf("scraping %d targets through port forwards: %v", len(targets), jobs)
	if jobs[cluster.JobNode] == 0 || jobs[cluster.JobSnapshotter] == 0 {
		t.Errorf("targets %v lack a node agent or csi-snapshotter", jobs)
	}
	prom := cluster.StartPrometheusFor(t, ctx, bin, targets, 2*time.Second, 12*time.Minute)
	waitFor(t, 2*time.Minute, fmt.Sprintf("every one of the %d targets up and scraped twice", len(targets)), func(ctx context.Context) (bool, string, error) {
		return promcheck.ScrapedTwiceSince(ctx, prom.API, driven, len(targets))
	})

	// The node agent reads LVM's state on its own schedule: each query
	// gets until then to have series.
	var empty []string
	waitFor(t, 2*time.Minute, fmt.Sprintf("each of the %d device-mapper queries with series", len(want)), func(ctx context.Context) (bool, string, error) {
		empty = empty[:0]
		for _, q := range want {
			n, err := promcheck.SeriesOf(ctx, prom.API, q.Expr)
			if err != nil {
				return false, "", fmt.Errorf("%s: %w", q.Where, err)
			}
			if n == 0 {
				empty = append(empty, q.Where+": "+q.Expr)
			}
		}
		return len(empty) == 0, "no series yet: " + strings.Join(empty, "; "), nil
	})
	for _, q := range want {
		t.Logf("%s: has series", q.Where)
	}
	t.Logf("%d device-mapper queries evaluated on %s, each with series, %s after the drive", len(want), nodeName, time.Since(driven).Round(time.Millisecond))
}
