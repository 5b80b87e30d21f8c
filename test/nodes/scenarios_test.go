//go:build nodes

package nodes

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-csi/carve/test/harness/plugintest"
)

const (
	thickSC = "carve-thick-ext4"
	thinSC  = "carve-thin-xfs"
)

// TestKubeletRegistersCarve: the kubelet, not the harness, wrote the
// CSINode entry and the topology label, from carve's own registration
// socket (no node-driver-registrar runs).
func TestKubeletRegistersCarve(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	csiNode, err := bed.Client.StorageV1().CSINodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, d := range csiNode.Spec.Drivers {
		if d.Name == "lvm.carve.dev" {
			found = true
			if d.NodeID != nodeName || len(d.TopologyKeys) != 1 || d.TopologyKeys[0] != "topology.carve.dev/node" {
				t.Errorf("CSINode driver entry %+v: want node ID %s and topology key topology.carve.dev/node", d, nodeName)
			}
		}
	}
	if !found {
		t.Errorf("CSINode %s lists no lvm.carve.dev driver: %+v", nodeName, csiNode.Spec.Drivers)
	}
	node, err := bed.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Labels["topology.carve.dev/node"]; got != nodeName {
		t.Errorf("Node label topology.carve.dev/node = %q, want %q (set by the kubelet at registration)", got, nodeName)
	}
	p := carvePod(t, ctx)
	names := map[string]bool{}
	for _, c := range p.Spec.Containers {
		names[c.Name] = true
	}
	for _, gone := range []string{"node-driver-registrar", "livenessprobe"} {
		if names[gone] {
			t.Errorf("the DaemonSet still runs %s", gone)
		}
	}
}

// TestNodeWithoutTheClassVolumeGroup: a device class whose volume group
// this node lacks leaves the carve pod up (no restart during the test,
// not ready), the node reports zero capacity for it, and a claim of that
// class is never sent there. The class has been in the device-class file
// since the bed started, so a crash loop would show as a restart here.
func TestNodeWithoutTheClassVolumeGroup(t *testing.T) {
	ns := newNamespace(t, "absent")
	ctx := testCtx(t, 10*time.Minute)
	// Other tests kill the agent on purpose (the IO-limits test runs
	// before this one): only a restart during this one counts.
	restarts := containerStatus(carvePod(t, ctx), "carve").RestartCount
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "carve-" + absentClass},
		Provisioner:       "lvm.carve.dev",
		Parameters:        map[string]string{"carve.dev/device-class": absentClass},
		VolumeBindingMode: &wffc,
	}
	if _, err := bed.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bed.Client.StorageV1().StorageClasses().Delete(context.Background(), sc.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	waitFor(t, 3*time.Minute, "a zero capacity for the class on "+nodeName, func(ctx context.Context) (bool, string, error) {
		caps, err := bed.Client.StorageV1().CSIStorageCapacities(bed.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		for _, c := range caps.Items {
			if c.StorageClassName == sc.Name && c.NodeTopology != nil && c.NodeTopology.MatchLabels["topology.carve.dev/node"] == nodeName {
				return c.Capacity != nil && c.Capacity.IsZero(), fmt.Sprintf("capacity %v", c.Capacity), nil
			}
		}
		return false, "no CSIStorageCapacity object yet", nil
	})
	pvc := newPVC(ns, "data", sc.Name, "256Mi")
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bed.Client.CoreV1().Pods(ns).Create(ctx, newPod(ns, "app", "data", false, sleeper), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, shortWait, "the scheduler refusing the node for lack of capacity", func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		if refusedFor(p, "storage") {
			return true, "", nil
		}
		return false, podState(p), nil
	})
	c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Spec.VolumeName != "" {
		t.Errorf("a volume %s was made for a class this node lacks", c.Spec.VolumeName)
	}
	p := carvePod(t, ctx)
	cs := containerStatus(p, "carve")
	if cs.RestartCount != restarts || cs.State.Running == nil {
		t.Errorf("the carve container restarted or is down on a node that lacks a class's volume group: %s, restarts %d", podState(p), cs.RestartCount)
	}
	if cs.Ready {
		t.Errorf("the carve container is ready although a class's volume group is missing (readiness should say so)")
	}
}

// refusedFor tells whether the scheduler refused pod p with a message
// that contains why.
func refusedFor(p *corev1.Pod, why string) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, why) {
			return true
		}
	}
	return false
}

// statefulSet has one replica of carve's image with a thick ext4 claim at
// /thick and a thin xfs claim at /thin; its container writes a value to
// each the first time and then sleeps.
func statefulSet(ns, name string) *appsv1.StatefulSet {
	zero := int64(0)
	claim := func(n, sc string) corev1.PersistentVolumeClaim {
		c := newPVC(ns, n, sc, "1Gi")
		c.Namespace = ""
		return *c
	}
	script := `for d in /thick /thin; do [ -s $d/value ] || { cat /proc/sys/kernel/random/uuid > $d/value.tmp && mv $d/value.tmp $d/value; }; done; sync; ` + sleeper
	return newStatefulSet(ns, name, corev1.PodSpec{
		TerminationGracePeriodSeconds: &zero,
		Containers: []corev1.Container{{
			Name: "app", Image: carveImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"/bin/sh", "-c", script},
			VolumeMounts: []corev1.VolumeMount{
				{Name: "thick", MountPath: "/thick"}, {Name: "thin", MountPath: "/thin"}},
		}},
	}, claim("thick", thickSC), claim("thin", thinSC))
}

// readValues reads the values the StatefulSet's pod wrote to its two
// volumes and their filesystems' types. A Running pod's script may not
// have written both yet, so it waits until both are there.
func readValues(t *testing.T, ns, pod string) (values, fsTypes string) {
	t.Helper()
	var lines []string
	waitFor(t, podTimeout, "pod "+ns+"/"+pod+" to have written both values", func(ctx context.Context) (bool, string, error) {
		out, err := kubectl(ctx, "exec", "-n", ns, pod, "--", "/bin/sh", "-c", "cat /thick/value /thin/value; stat -f -c %T /thick /thin")
		if err != nil {
			return notYet(err)
		}
		lines = strings.Fields(out)
		return len(lines) == 4, fmt.Sprintf("read %q, want two values and two filesystem types", out), nil
	})
	return lines[0] + " " + lines[1], lines[2] + " " + lines[3]
}

// TestStatefulSetPodComesBackToItsData: a StatefulSet pod writes a
// value to a thick ext4 and a thin xfs volume; deleted, it comes back on
// the same node and reads the same values.
func TestStatefulSetPodComesBackToItsData(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "sts")
	ctx := testCtx(t, 10*time.Minute)
	if _, err := bed.Client.AppsV1().StatefulSets(ns).Create(ctx, statefulSet(ns, "db"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitPodRunning(t, ns, "db-0", "")
	values, fsTypes := readValues(t, ns, "db-0")
	if fsTypes != "ext2/ext3 xfs" {
		t.Errorf("filesystems of /thick and /thin: %q, want ext4 (stat says ext2/ext3) and xfs", fsTypes)
	}
	if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, "db-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	second := waitPodRunning(t, ns, "db-0", string(first.UID))
	if second.Spec.NodeName != first.Spec.NodeName {
		t.Errorf("the pod came back on %s, was on %s", second.Spec.NodeName, first.Spec.NodeName)
	}
	if again, _ := readValues(t, ns, "db-0"); again != values {
		t.Errorf("after the pod was recreated it reads %q, wrote %q", again, values)
	}
}

// dfBytes returns the size and used bytes of the filesystem at path, as
// df in the container sees them.
func dfBytes(t *testing.T, ns, pod, path string) (size, used int64) {
	t.Helper()
	out := podExec(t, ns, pod, "df -B1 --output=size,used "+path+" | tail -n 1")
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("df in %s: %q", pod, out)
	}
	size, err1 := strconv.ParseInt(f[0], 10, 64)
	used, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("df in %s: %q", pod, out)
	}
	return size, used
}

// TestOnlineExpansionReachesTheContainer: a PVC grows from 1 Gi to 2 Gi
// while its pod runs (csi-resizer, then the kubelet's NodeExpandVolume);
// df in the container shows it, the claim's status follows, and the
// container was never restarted.
func TestOnlineExpansionReachesTheContainer(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "grow")
	ctx := testCtx(t, 10*time.Minute)
	pod := createClaimAndPod(t, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data", false, sleeper))
	before, _ := dfBytes(t, ns, "app", "/data")
	if before > 1<<30 || before < 900<<20 {
		t.Fatalf("a 1 GiB ext4 volume shows %d bytes in df", before)
	}
	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`)
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podTimeout, "the claim's status capacity at 2Gi", func(ctx context.Context) (bool, string, error) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		got := c.Status.Capacity[corev1.ResourceStorage]
		return got.Cmp(resource.MustParse("2Gi")) == 0, fmt.Sprintf("capacity %s, conditions %v", got.String(), c.Status.Conditions), nil
	})
	waitFor(t, shortWait, "df in the container showing the grown filesystem", func(ctx context.Context) (bool, string, error) {
		after, _ := dfBytes(t, ns, "app", "/data")
		return after > before+900<<20, fmt.Sprintf("df size %d bytes (was %d)", after, before), nil
	})
	now, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != pod.UID || now.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the pod was replaced or its container restarted during the expansion (restarts %d)", now.Status.ContainerStatuses[0].RestartCount)
	}
}

// TestRawBlockVolumeReadsWhatItWrote: a Block claim appears in the
// container as a device of the claim's size that reads back what was
// written to it.
func TestRawBlockVolumeReadsWhatItWrote(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "block")
	pvc := newPVC(ns, "raw", thinSC, "256Mi")
	block := corev1.PersistentVolumeBlock
	pvc.Spec.VolumeMode = &block
	createClaimAndPod(t, pvc, newPod(ns, "app", "raw", true, sleeper))
	out := podExec(t, ns, "app", `blockdev --getsize64 /dev/xvda
head -c 4194304 /dev/urandom > /tmp/w
dd if=/tmp/w of=/dev/xvda bs=1M oflag=direct status=none
dd if=/dev/xvda of=/tmp/r bs=1M count=4 iflag=direct status=none
cmp /tmp/w /tmp/r && echo same`)
	f := strings.Fields(out)
	if len(f) != 2 || f[0] != strconv.Itoa(256<<20) || f[1] != "same" {
		t.Errorf("raw block device: %q, want its size %d and \"same\" (what was read equals what was written)", out, 256<<20)
	}
}

// TestFSGroupLetsNonRootWrite: a container running as a non-root user
// with an fsGroup writes to its volume, and the volume's root belongs to
// that group. The claim asks 256 MiB of xfs, below mkfs.xfs's minimum: it
// gets 300 MiB and stages.
func TestFSGroupLetsNonRootWrite(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "fsgroup")
	pod := newPod(ns, "app", "data", false, sleeper)
	uid, gid, fsGroup := int64(1000), int64(1000), int64(2000)
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: &uid, RunAsGroup: &gid, FSGroup: &fsGroup}
	createClaimAndPod(t, newPVC(ns, "data", thinSC, "256Mi"), pod)
	c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(testCtx(t, time.Minute), "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Status.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("300Mi")) != 0 {
		t.Errorf("a 256Mi xfs claim got %s, want 300Mi (mkfs.xfs's minimum)", got.String())
	}
	out := podExec(t, ns, "app", "id -u; echo hello > /data/f && cat /data/f; stat -c %g /data")
	if f := strings.Fields(out); len(f) != 3 || f[0] != "1000" || f[1] != "hello" || f[2] != "2000" {
		t.Errorf("non-root writer: %q, want uid 1000, the written line, and group 2000 on the volume root", out)
	}
}

// kubeletVolumeStat reads one kubelet_volume_stats_* series of a claim
// from the kubelet's own /metrics.
func kubeletVolumeStat(ctx context.Context, metric, ns, claim string) (float64, error) {
	// The kubelet serves its own self-signed certificate.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // a test bed's kubelet on loopback
	ms, err := plugintest.ScrapeURL(ctx, insecure, "https://"+bed.GuestNode(nodeName).KubeletAddr+"/metrics")
	if err != nil {
		return 0, err
	}
	v, ok, err := ms.Gauge(metric, map[string]string{"namespace": ns, "persistentvolumeclaim": claim})
	if err == nil && !ok {
		err = fmt.Errorf("the kubelet has no %s for %s/%s yet", metric, ns, claim)
	}
	return v, err
}

// TestKubeletVolumeStatsMatchDf: the kubelet's volume statistics (from
// carve's NodeGetVolumeStats) agree with df in the container.
func TestKubeletVolumeStatsMatchDf(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "stats")
	createClaimAndPod(t, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data", false, sleeper))
	podExec(t, ns, "app", "head -c 52428800 /dev/zero > /data/fill && sync")
	size, used := dfBytes(t, ns, "app", "/data")
	waitFor(t, 2*time.Minute, "kubelet_volume_stats_* agreeing with df", func(ctx context.Context) (bool, string, error) {
		capacity, err := kubeletVolumeStat(ctx, "kubelet_volume_stats_capacity_bytes", ns, "data")
		if err != nil {
			return notYet(err)
		}
		usedStat, err := kubeletVolumeStat(ctx, "kubelet_volume_stats_used_bytes", ns, "data")
		if err != nil {
			return notYet(err)
		}
		// df's used is (blocks - free) like carve's; a few blocks of
		// journal or metadata activity may lie between the two reads.
		ok := int64(capacity) == size && abs(int64(usedStat)-used) <= 1<<20
		return ok, fmt.Sprintf("kubelet capacity %.0f used %.0f; df size %d used %d", capacity, usedStat, size, used), nil
	})
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// lvState returns an LV's attributes as `lvs` in the guest reports them:
// "active open" style words, or "" when it does not exist.
func lvState(t *testing.T, volumeHandle string) string {
	t.Helper()
	return strings.TrimSpace(guestExec(t, fmt.Sprintf("lvs --noheadings -o lv_active,lv_device_open %s 2>/dev/null || true", volumeHandle)))
}

func volumeHandle(t *testing.T, pv string) string {
	t.Helper()
	p, err := bed.Client.CoreV1().PersistentVolumes().Get(testCtx(t, time.Minute), pv, metav1.GetOptions{})
	if err != nil || p.Spec.CSI == nil {
		t.Fatalf("PV %s: %v", pv, err)
	}
	return p.Spec.CSI.VolumeHandle
}

// TestPluginKilledWhilePodWrites: killing the carve container does not
// stop a pod writing to its volume; the plugin comes back, and deleting
// the pod afterwards unpublishes and unstages cleanly (nothing mounted,
// the LV closed).
func TestPluginKilledWhilePodWrites(t *testing.T) {
	ns := newNamespace(t, "kill")
	ctx := testCtx(t, 10*time.Minute)
	createClaimAndPod(t, newPVC(ns, "data", thinSC, "512Mi"),
		newPod(ns, "writer", "data", false, "i=0; while :; do i=$((i+1)); echo $i >> /data/log; sleep 0.2; done"))
	handle := volumeHandle(t, pvOf(t, ns, "data"))
	before := carvePod(t, ctx)
	restarts := containerStatus(before, "carve").RestartCount
	lines := func() int {
		n, err := strconv.Atoi(strings.TrimSpace(podExec(t, ns, "writer", "wc -l < /data/log")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The node agent is carve-node (the DaemonSet's command).
	guestExec(t, "pkill -KILL -f '^/usr/local/bin/carve-node node'")
	atKill := lines()
	waitFor(t, podTimeout, "the carve container restarted and running", func(ctx context.Context) (bool, string, error) {
		p := carvePod(t, ctx)
		c := containerStatus(p, "carve")
		return c.RestartCount > restarts && c.State.Running != nil, fmt.Sprintf("restarts %d, %s", c.RestartCount, podState(p)), nil
	})
	if after := lines(); after <= atKill {
		t.Errorf("the writer stopped while the plugin was down: %d lines at the kill, %d after the restart", atKill, after)
	}
	if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, "writer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podTimeout, "the writer pod gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "writer", metav1.GetOptions{})
		return apierrors.IsNotFound(err), "pod still there", nil
	})
	lvName := handle[strings.Index(handle, "/")+1:]
	waitFor(t, shortWait, "no mount of the volume left and its LV closed", func(ctx context.Context) (bool, string, error) {
		mounts := strings.TrimSpace(guestExec(t, "grep -e "+lvName+" -e "+strings.ReplaceAll(lvName, "-", "--")+" /proc/self/mountinfo || true"))
		state := lvState(t, handle)
		return mounts == "" && !strings.HasSuffix(state, "open"), fmt.Sprintf("mounts %q, LV %q", mounts, state), nil
	})
}

// TestNodeRebootKeepsData: the guest node powers off (after a sync) and
// boots again from the same disks; the kubelet comes back, the pod runs
// again on that node with its volumes staged again (activated first: no
// LVM autoactivation runs in the guest), and the data is there.
func TestNodeRebootKeepsData(t *testing.T) {
	ns := newNamespace(t, "reboot")
	ctx := testCtx(t, 15*time.Minute)
	if _, err := bed.Client.AppsV1().StatefulSets(ns).Create(ctx, statefulSet(ns, "db"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitPodRunning(t, ns, "db-0", "")
	values, _ := readValues(t, ns, "db-0")
	g := bed.GuestNode(nodeName)
	down := time.Now()
	if err := g.Stop(2 * time.Minute); err != nil {
		t.Fatalf("power off: %v", err)
	}
	if err := g.Boot(ctx, bed.Client); err != nil {
		t.Fatalf("boot again: %v", err)
	}
	ready := time.Since(down)
	var again *corev1.Pod
	waitFor(t, 2*podTimeout, "db-0 running again after the reboot", func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "db-0", metav1.GetOptions{})
		if err != nil {
			return notYet(err)
		}
		again = p
		c := containerStatus(p, "app")
		started := c != nil && c.State.Running != nil && c.State.Running.StartedAt.After(down)
		return allRunning(p) && started, podState(p), nil
	})
	t.Logf("reboot: Node Ready %s after power-off, pod running again %s after power-off", ready.Round(time.Second), time.Since(down).Round(time.Second))
	if again.Spec.NodeName != first.Spec.NodeName {
		t.Errorf("the pod runs on %s after the reboot, was on %s", again.Spec.NodeName, first.Spec.NodeName)
	}
	if got, _ := readValues(t, ns, "db-0"); got != values {
		t.Errorf("after the reboot the pod reads %q, wrote %q", got, values)
	}
}

// capacityOf returns the node's capacity for a StorageClass.
func capacityOf(ctx context.Context, sc string) (int64, error) {
	caps, err := bed.Client.StorageV1().CSIStorageCapacities(bed.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	for _, c := range caps.Items {
		if c.StorageClassName == sc && c.NodeTopology != nil && c.NodeTopology.MatchLabels["topology.carve.dev/node"] == nodeName && c.Capacity != nil {
			return c.Capacity.Value(), nil
		}
	}
	return 0, fmt.Errorf("no capacity of %s on %s", sc, nodeName)
}

// TestDeletingTheClaimRemovesTheLV: deleting the pod and then its claim
// removes the LV in the guest, and the node's capacity comes back.
func TestDeletingTheClaimRemovesTheLV(t *testing.T) {
	ns := newNamespace(t, "delete")
	ctx := testCtx(t, 10*time.Minute)
	var before int64
	waitFor(t, 3*time.Minute, "the thick class's capacity", func(ctx context.Context) (bool, string, error) {
		var err error
		before, err = capacityOf(ctx, thickSC)
		return err == nil && before > 0, fmt.Sprint(err), nil
	})
	createClaimAndPod(t, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data", false, sleeper))
	pv := pvOf(t, ns, "data")
	handle := volumeHandle(t, pv)
	if lvState(t, handle) == "" {
		t.Fatalf("no LV %s in the guest for PV %s", handle, pv)
	}
	waitFor(t, 3*time.Minute, "the capacity to drop by the volume", func(ctx context.Context) (bool, string, error) {
		now, err := capacityOf(ctx, thickSC)
		return err == nil && now <= before-1<<30, fmt.Sprintf("capacity %d (was %d)", now, before), nil
	})
	if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, podTimeout, "the pod gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		return apierrors.IsNotFound(err), "pod still there", nil
	})
	if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the PV and its LV gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		state := lvState(t, handle)
		return apierrors.IsNotFound(err) && state == "", fmt.Sprintf("PV: %v; LV %q", err, state), nil
	})
	waitFor(t, 3*time.Minute, "the capacity back", func(ctx context.Context) (bool, string, error) {
		now, err := capacityOf(ctx, thickSC)
		return err == nil && now == before, fmt.Sprintf("capacity %d, before %d", now, before), nil
	})
}

// TestReadWriteOncePodKeepsASecondPodOut: a second pod using a
// ReadWriteOncePod claim does not start, and the first keeps running.
func TestReadWriteOncePodKeepsASecondPodOut(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "rwop")
	ctx := testCtx(t, 10*time.Minute)
	pvc := newPVC(ns, "data", thinSC, "512Mi")
	pvc.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
	first := createClaimAndPod(t, pvc, newPod(ns, "first", "data", false, sleeper))
	if _, err := bed.Client.CoreV1().Pods(ns).Create(ctx, newPod(ns, "second", "data", false, sleeper), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, shortWait, "the second pod refused by the scheduler", func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		if p.Spec.NodeName != "" {
			return false, "", fmt.Errorf("the second pod was bound to %s", p.Spec.NodeName)
		}
		if refusedFor(p, "ReadWriteOncePod") {
			return true, "", nil
		}
		return false, podState(p), nil
	})
	now, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "first", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != first.UID || !allRunning(now) || now.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the first pod did not keep running: %s", podState(now))
	}
}
