//go:build peers

package peers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// TestPeersCapacityFreshness changes each driver's volume group on one
// node outside the driver, at the same moment (an LV made with lvcreate,
// then removed with lvremove), and times how long until that node's
// CSIStorageCapacity object of each driver shows the change, polling every
// 250 ms up to opts.freshnessCap. It prints both times and their ratio (a
// bound when one side never showed it); it asserts that carve showed every
// change within the cap.
func TestPeersCapacityFreshness(t *testing.T) {
	const node = "node-medium"
	const size = 512 << 20
	n, tn := bed.Node(node), peer.nodes[node]
	if n == nil || tn == nil {
		t.Fatalf("no node %s on the test bed", node)
	}
	steps := []struct {
		what          string
		carve, peerFn func(ctx context.Context) error
	}{
		{"lvcreate", func(ctx context.Context) error { return n.FillVG(ctx, "outside", size) },
			func(ctx context.Context) error {
				_, err := tn.VG.LVM(ctx, "lvcreate", "--yes", "--activate", "n", "--zero", "n", "--name", "outside", "--size", strconv.Itoa(size)+"b", tn.VG.Name)
				return err
			}},
		{"lvremove", func(ctx context.Context) error { return n.RemoveLV(ctx, "outside") },
			func(ctx context.Context) error {
				_, err := tn.VG.LVM(ctx, "lvremove", "--yes", tn.VG.Name+"/outside")
				return err
			}},
	}
	for _, s := range steps {
		ctx := kubetest.Ctx(t, opts.freshnessCap+time.Minute)
		before := map[string]int64{}
		for _, d := range []driver{carveSide, topolvmSide} {
			b, err := capacityOf(ctx, d, node)
			if err != nil {
				t.Fatal(err)
			}
			before[d.name] = b
		}
		start := time.Now()
		if err := errors.Join(s.carve(ctx), s.peerFn(ctx)); err != nil {
			t.Fatalf("%s outside the drivers: %v", s.what, err)
		}
		seen := map[string]time.Duration{}
		for time.Since(start) < opts.freshnessCap && len(seen) < 2 {
			for _, d := range []driver{carveSide, topolvmSide} {
				if _, ok := seen[d.name]; ok {
					continue
				}
				now, err := capacityOf(ctx, d, node)
				if err != nil {
					t.Fatal(err)
				}
				if now != before[d.name] {
					seen[d.name] = time.Since(start).Round(100 * time.Millisecond)
				}
			}
			time.Sleep(250 * time.Millisecond)
		}
		show := func(d driver) string {
			if v, ok := seen[d.name]; ok {
				return v.String()
			}
			return "> " + opts.freshnessCap.String()
		}
		line := fmt.Sprintf("ratio capacity freshness after an outside %s of 512 MiB on %s: carve %s / TopoLVM %s", s.what, node, show(carveSide), show(topolvmSide))
		c, cok := seen[carveSide.name]
		p, pok := seen[topolvmSide.name]
		switch {
		case cok && pok:
			line += fmt.Sprintf(" = %.3f", ratio(c, p))
		case cok:
			line += fmt.Sprintf(" < %.3f", ratio(c, opts.freshnessCap))
		}
		t.Log(line)
		fmt.Println(line)
		if !cok {
			t.Errorf("carve's CSIStorageCapacity on %s did not show an outside %s within %s", node, s.what, opts.freshnessCap)
		}
	}
}

// capacityOf is the capacity d's CSIStorageCapacity object publishes for
// node (0 when there is none yet).
func capacityOf(ctx context.Context, d driver, node string) (int64, error) {
	list, err := bed.Client.StorageV1().CSIStorageCapacities("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	key := topologyKey(d)
	for _, c := range list.Items {
		if c.StorageClassName == d.storageClass && c.NodeTopology != nil && c.NodeTopology.MatchLabels[key] == node && c.Capacity != nil {
			return c.Capacity.Value(), nil
		}
	}
	return 0, nil
}

// topologyKey is the Node label d's CSIStorageCapacity objects select on.
func topologyKey(d driver) string {
	if d.csiName == topolvmDriver {
		return topolvmTopologyKey
	}
	return cluster.TopologyKey
}
