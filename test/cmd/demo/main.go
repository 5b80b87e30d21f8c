// Command demo is `make demo`: it starts carve's end-to-end test bed (a real
// etcd, kube-apiserver, kube-scheduler and kube-controller-manager; one real
// node, a qemu guest with a kubelet, containerd and device-mapper running
// the shipped DaemonSet from carve's image; and three simulated nodes with
// volume groups of 2, 4 and 10 GiB, each running `carve node` and
// csi-provisioner as processes), applies an example StorageClass and two
// StatefulSets, one of them PostgreSQL servers under pgbench on the real
// node, prints where every volume landed, what the real node's containers
// see and each database's size and transactions per second, and keeps the
// cluster up until Ctrl-C, printing the databases' figures each minute,
// then tears everything down. It needs root (qemu, loop devices, LVM).
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
)

//go:embed demo.yaml
var example []byte

// realNode is the demo's one guest node.
const realNode = "real-1"

// options are the demo's flags.
type options struct {
	binDir, carve, deploy, images, postgres string
	lifetime, wait                          time.Duration
}

func main() {
	o := options{}
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	fs.StringVar(&o.binDir, "bin-dir", os.Getenv("CARVE_E2E_BIN"), "directory with etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, csi-provisioner, csi-resizer (hack/e2e-tools.sh)")
	fs.StringVar(&o.carve, "carve", "bin/carve", "the carve binary (make build)")
	fs.StringVar(&o.deploy, "deploy", "deploy/kubernetes", "carve's manifests")
	fs.StringVar(&o.images, "images", os.Getenv("CARVE_IMAGES"), "directory of the image archives the real node imports (make images)")
	fs.StringVar(&o.postgres, "postgres-image", os.Getenv("CARVE_POSTGRES_IMAGE"), "the PostgreSQL image archive db's pods run (hack/postgres-image.sh)")
	fs.DurationVar(&o.lifetime, "lifetime", 8*time.Hour, "the cluster is torn down after this even without Ctrl-C")
	fs.DurationVar(&o.wait, "wait", 15*time.Minute, "how long to wait for every PVC and pod to be bound and every database to run pgbench")
	klog.InitFlags(fs)
	if err := fs.Set("v", "0"); err != nil {
		panic(err)
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	start := time.Now()
	if o.binDir == "" || o.images == "" || o.postgres == "" {
		return errors.New("--bin-dir (or CARVE_E2E_BIN), --images (or CARVE_IMAGES) and --postgres-image (or CARVE_POSTGRES_IMAGE) are required; `make demo` sets them")
	}
	archives, err := filepath.Glob(filepath.Join(o.images, "*.tar"))
	if err != nil || len(archives) == 0 {
		return fmt.Errorf("no image archives in %s (make images builds them): %w", o.images, err)
	}
	archives = append(archives, o.postgres)
	carve, err := filepath.Abs(o.carve)
	if err != nil {
		return err
	}
	deploy, err := filepath.Abs(o.deploy)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.lifetime)
	defer cancel()

	// Measured warm on 2 cores (2026-11-26, before PostgreSQL): the real
	// node was Ready after 4 min 8 s, most of it containerd importing the
	// image archives under qemu's emulation (TCG); the table followed at
	// 5 min.
	fmt.Println("Starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager, three simulated nodes and one real node (a qemu guest, emulated: about 5 minutes on 2 cores, most of it importing the image archives, PostgreSQL's among them)...")
	bed, err := cluster.Start(ctx, cluster.Config{
		BinDir: o.binDir, CarveBin: carve, DeployDir: deploy, Lifetime: o.lifetime,
		Nodes: []cluster.NodeSpec{
			{Name: "node-small", VGSize: 2 << 30},
			{Name: "node-medium", VGSize: 4 << 30},
			{Name: "node-large", VGSize: 10 << 30},
		},
		GuestNodes: []cluster.GuestNodeSpec{{Name: realNode, DataDiskSize: 12 << 30, FirstBoot: cluster.ShippedClassesFirstBoot("3g")}},
		Images:     archives,
		// The controller Deployment runs on the real node, as users run
		// it: from there it reaches that node's agent at its pod IP and the
		// simulated nodes' agents at this host's address.
		ControllerOnGuest:     true,
		SnapshotControllerDir: filepath.Join(deploy, "snapshot-controller"),
	})
	if err != nil {
		return err
	}
	fmt.Printf("Test bed up %s after start.\n", time.Since(start).Round(time.Second))
	defer func() {
		fmt.Println("\nTearing down: stopping every process, removing the volume groups and loop devices...")
		if err := bed.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "demo: teardown: %v\n", err)
			return
		}
		fmt.Printf("Done. Logs stay in %s\n", filepath.Join(bed.Config.RunDir, "logs"))
	}()

	objs, err := cluster.ParseManifests(example, "demo.yaml")
	if err != nil {
		return err
	}
	if err := objs.Apply(ctx, bed.Control.Config); err != nil {
		return fmt.Errorf("apply the example: %w", err)
	}
	fmt.Printf("Applied StorageClass carve-demo, StatefulSet demo/db (2 PostgreSQL 15 servers on 1 GiB volumes, on %s) and demo/spread (6 x 1 GiB, on the simulated nodes); waiting for every PVC to be bound and each db pod's PostgreSQL to be made (initdb --data-checksums, emulated: a few minutes) and to run pgbench...\n", realNode)
	if err := waitPlaced(ctx, bed, "demo", 8, o.wait); err != nil {
		bed.DumpLogs(20)
		return err
	}
	dbs, err := startDatabases(ctx, bed, "demo")
	if err != nil {
		return err
	}
	fmt.Printf("pgbench runs in %s; counting a minute of its transactions...\n", strings.Join(dbs.pods, " and "))
	if err := dbs.measure(ctx, tpsWindow); err != nil {
		return err
	}
	if err := waitCapacity(ctx, bed, 30*time.Second); err != nil {
		fmt.Printf("(%v; the capacity column may lag)\n", err)
	}
	if err := printTable(ctx, bed, "demo", dbs); err != nil {
		return err
	}
	fmt.Printf("\nTable printed %s after start.\n", time.Since(start).Round(100*time.Millisecond))
	kubectl := filepath.Join(o.binDir, "kubectl")
	fmt.Printf(`
What is real: the control plane; on %[1]s a kubelet, containerd and
device-mapper in a qemu guest, running the shipped DaemonSet and controller
Deployment from carve's image: db's volumes are real LVs, formatted and
mounted, and df above ran inside each container. Each db pod is a
PostgreSQL 15 made on its volume with data checksums (fsync and synchronous
commit on, PostgreSQL's defaults) with pgbench's TPC-B-like transactions
running against it, one client, as fast as the guest allows: POSTGRES SIZE
is pg_database_size, TPS the transactions the server committed per second
over the last minute (pg_stat_database.xact_commit). Under qemu's emulation
(no KVM here) the figures are a guest's, not a disk's: carve's thick volume
is a plain device-mapper linear target, PostgreSQL writes through it as
through any LV.
What is simulated: node-small, node-medium and node-large have no kubelet
(spread's pods are scheduled and bound, their containers never start); their
carve nodes run as processes with LVM activation disabled (the host kernel
has no device-mapper), so their LVs are LVM metadata without a /dev node.
`, realNode)
	fmt.Printf(`
Kubeconfig:  %s
kubectl:     %s (built with the control plane), e.g.
  %s --kubeconfig %s get pods,pvc,pv,csistoragecapacities -A
`, bed.Control.Kubeconfig, kubectl, kubectl, bed.Control.Kubeconfig)
	fmt.Println("Metrics:")
	for _, n := range bed.Nodes {
		fmt.Printf("  %-12s carve %s   node channel %s\n", n.Name, n.MetricsURL, n.ChannelAddr)
	}
	fmt.Printf("  %-12s runs on %s: %s --kubeconfig %s -n %s logs deploy/carve-controller -c carve\n", "controller", realNode, kubectl, bed.Control.Kubeconfig, bed.Namespace)
	fmt.Printf("Logs:        %s\n", filepath.Join(bed.Config.RunDir, "logs"))
	for _, n := range bed.Nodes {
		fmt.Printf("  lvs of %s: LVM_SYSTEM_DIR=%s lvs %s\n", n.Name, n.VG.ConfigDir, n.VG.Name)
	}
	for _, g := range bed.GuestNodes {
		fmt.Printf("  %s: kubelet log %s, boot log %s\n", g.Spec.Name, g.LogPath("kubelet"), g.LogPath("boot"))
	}
	fmt.Printf("  PostgreSQL: %s --kubeconfig %s -n demo exec db-0 -- psql -h /tmp -U postgres\n", kubectl, bed.Control.Kubeconfig)
	fmt.Println("\nThe cluster stays up; each minute a line gives every database's size and TPS over the last minute. Press Ctrl-C to tear it down.")

	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	sample := time.NewTicker(dbSampleEvery)
	defer sample.Stop()
	report := time.NewTicker(tpsWindow)
	defer report.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := bed.CheckAlive(); err != nil {
				return err
			}
		case <-sample.C:
			if err := dbs.sample(ctx); err != nil && ctx.Err() == nil {
				fmt.Printf("(%v)\n", err)
			}
		case now := <-report.C:
			fmt.Println(dbs.line(now))
		}
	}
}

// waitPlaced waits until the namespace holds want PVCs, all Bound, and
// want pods, all bound to a node (the scheduler binds a pod only after its
// volumes are Bound).
func waitPlaced(ctx context.Context, bed *cluster.Cluster, ns string, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pvcs, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		pods, err := bed.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		bound, placed, waiting := 0, 0, 0
		for _, p := range pvcs.Items {
			if p.Status.Phase == corev1.ClaimBound {
				bound++
			}
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.Spec.NodeName != "" {
				placed++
			}
			// Pods on the real node must also be Ready: their databases
			// made and pgbench running.
			if bed.GuestNode(p.Spec.NodeName) != nil && !podReady(p) {
				waiting++
			}
		}
		if bound == want && placed == want && waiting == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s in namespace %s: %d of %d PVCs Bound, %d of %d pods bound to a node, %d on the real node not Ready%s", timeout, ns, bound, want, placed, want, waiting, unenrolledGuests(ctx, bed))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// waitCapacity waits until every node's published capacity for carve-demo
// equals its VG free space minus the thick class's spare, so the table
// shows capacity after the volumes, not before.
func waitCapacity(ctx context.Context, bed *cluster.Cluster, timeout time.Duration) error {
	var spare uint64
	for i := range bed.DeviceClasses.DeviceClasses {
		if c := &bed.DeviceClasses.DeviceClasses[i]; c.Name == "thick" {
			spare = c.SpareBytes()
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		caps, err := bed.Client.StorageV1().CSIStorageCapacities(bed.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		settled := 0
		for _, n := range bed.Nodes {
			vg, err := n.LVM.VolumeGroup(ctx, n.VG.Name)
			if err != nil {
				return err
			}
			var want int64
			if vg.Free > spare {
				want = int64((vg.Free - spare) / vg.ExtentSize * vg.ExtentSize)
			}
			for _, c := range caps.Items {
				if c.StorageClassName == "carve-demo" && c.NodeTopology != nil && c.Capacity != nil &&
					c.NodeTopology.MatchLabels[cluster.TopologyKey] == n.Name && c.Capacity.Value() == want {
					settled++
				}
			}
		}
		if settled == len(bed.Nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("published capacity of %d of %d nodes not yet updated after %s", len(bed.Nodes)-settled, len(bed.Nodes), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// podReady says whether the pod runs and its Ready condition is true.
func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// printTable prints pod -> node -> PVC -> PV -> LV (from lvs) -> the
// node's remaining published capacity -> df in the container, and the
// database's size and TPS for the pods that run PostgreSQL.
func printTable(ctx context.Context, bed *cluster.Cluster, ns string, dbs *databases) error {
	pods, err := bed.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	caps, err := bed.Client.StorageV1().CSIStorageCapacities(bed.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	capacity := map[string]string{}
	for _, c := range caps.Items {
		if c.StorageClassName == "carve-demo" && c.NodeTopology != nil && c.Capacity != nil {
			capacity[c.NodeTopology.MatchLabels[cluster.TopologyKey]] = quantity(c.Capacity)
		}
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	if _, err := fmt.Fprintln(w, "\nPOD\tNODE\tPVC\tPV\tLV (lvs)\tLV SIZE\tNODE CAPACITY LEFT\tIN THE CONTAINER: df /data\tPOSTGRES SIZE\tTPS (LAST MINUTE)"); err != nil {
		return err
	}
	for _, p := range pods.Items {
		var claim string
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil {
				claim = v.PersistentVolumeClaim.ClaimName
			}
		}
		pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		lvName, lvSize := "-", "-"
		if n := bed.Node(p.Spec.NodeName); n != nil && pvc.Spec.VolumeName != "" {
			lv, err := n.LVM.GetLV(ctx, n.VG.Name, volume.LVNameFor(pvc.Spec.VolumeName))
			if err != nil {
				return fmt.Errorf("lvs on %s for %s: %w", n.Name, pvc.Spec.VolumeName, err)
			}
			lvName = lv.VolumeGroup + "/" + lv.Name
			lvSize = bytes(lv.Size)
		}
		inside := "not run (simulated node)"
		if g := bed.GuestNode(p.Spec.NodeName); g != nil && pvc.Spec.VolumeName != "" {
			pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			lvName = pv.Spec.CSI.VolumeHandle
			out, err := g.Exec(ctx, "lvs --noheadings --units b --nosuffix -o lv_size "+lvName)
			if err != nil {
				return fmt.Errorf("lvs on %s: %w", g.Spec.Name, err)
			}
			if size, perr := strconv.ParseUint(strings.TrimSpace(out), 10, 64); perr == nil {
				lvSize = bytes(size)
			}
			if inside, err = containerDf(ctx, bed, ns, p.Name); err != nil {
				return err
			}
		}
		dbSize, tps := dbs.columns(p.Name)
		if _, err := fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.Spec.NodeName, claim, pvc.Spec.VolumeName, lvName, lvSize, capacity[p.Spec.NodeName], inside, dbSize, tps); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w, "\nNODE\tVG SIZE\tVG FREE\tVOLUMES\tPUBLISHED CAPACITY (free - spare)"); err != nil {
		return err
	}
	for _, n := range bed.Nodes {
		vg, err := n.LVM.VolumeGroup(ctx, n.VG.Name)
		if err != nil {
			return fmt.Errorf("vgs on %s: %w", n.Name, err)
		}
		volumes := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName == n.Name {
				volumes++
			}
		}
		if _, err := fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", n.Name, bytes(vg.Size), bytes(vg.Free), volumes, capacity[n.Name]); err != nil {
			return err
		}
	}
	for _, g := range bed.GuestNodes {
		// The shipped classes' volume group, with the thin pool in it.
		out, err := g.Exec(ctx, "vgs --noheadings --units b --nosuffix -o vg_size,vg_free,lv_count carve")
		if err != nil {
			return fmt.Errorf("vgs on %s: %w", g.Spec.Name, err)
		}
		f := strings.Fields(out)
		if len(f) != 3 {
			return fmt.Errorf("vgs on %s printed %q", g.Spec.Name, out)
		}
		size, _ := strconv.ParseUint(f[0], 10, 64)
		free, _ := strconv.ParseUint(f[1], 10, 64)
		if _, err := fmt.Fprintf(w, "%s\t%s\t%s\t%s LVs (thin pool included)\t%s\n", g.Spec.Name, bytes(size), bytes(free), f[2], capacity[g.Spec.Name]); err != nil {
			return err
		}
	}
	return w.Flush()
}

// containerDf runs df in the pod's container through the apiserver and
// the kubelet (kubectl exec) and returns size, used, type and device.
func containerDf(ctx context.Context, bed *cluster.Cluster, ns, pod string) (string, error) {
	kubectl := filepath.Join(bed.Config.BinDir, "kubectl")
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", bed.Control.Kubeconfig, "exec", "-n", ns, pod, "--",
		"df", "-h", "--output=size,used,fstype,source", "/data").Output()
	if err != nil {
		return "", fmt.Errorf("kubectl exec df in %s/%s: %w", ns, pod, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 4 {
		return "", fmt.Errorf("df in %s/%s printed %q", ns, pod, out)
	}
	return fmt.Sprintf("%s size, %s used, %s on %s", f[0], f[1], f[2], f[3]), nil
}

func bytes(v uint64) string {
	return quantity(resource.NewQuantity(int64(v), resource.BinarySI))
}

// quantity prints bytes in Mi/Gi as Kubernetes would.
func quantity(q *resource.Quantity) string {
	v := q.Value()
	switch {
	case v%(1<<30) == 0:
		return fmt.Sprintf("%dGi", v>>30)
	case v%(1<<20) == 0:
		return fmt.Sprintf("%dMi", v>>20)
	}
	return q.String()
}

// unenrolledGuests names the real nodes that carve controller never
// enrolled (no CSIStorageCapacity object names them): the first thing to
// look at when the real node's claims do not bind.
func unenrolledGuests(ctx context.Context, bed *cluster.Cluster) string {
	caps, err := bed.Client.StorageV1().CSIStorageCapacities(bed.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	var missing []string
	for _, g := range bed.GuestNodes {
		found := false
		for _, c := range caps.Items {
			if c.NodeTopology != nil && c.NodeTopology.MatchLabels[cluster.TopologyKey] == g.Spec.Name {
				found = true
			}
		}
		if !found {
			missing = append(missing, g.Spec.Name)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("; carve controller has no capacity for %v: it never enrolled their node agent (see the carve-controller and carve-node pods' logs on the real node)", missing)
}
