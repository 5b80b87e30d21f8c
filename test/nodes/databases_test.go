//go:build nodes && databases

package nodes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/carve-csi/carve/test/harness/kubetest"
	"github.com/carve-csi/carve/test/harness/pgcheck"
)

// The database tier (make test-databases): a PostgreSQL 15 with data
// checksums, fsync and synchronous commit on, runs as a pod on a carve
// claim of the guest node while pgbench's TPC-B-like transactions run in
// it, and a client in this test process, outside the guest, records every
// transaction it saw acknowledged. After each scenario: every
// acknowledged id is in the database, pgbench's sums agree, pg_amcheck
// (heap and every index, --heapallindexed) finds nothing, and
// pg_checksums --check on the stopped cluster finds nothing.

// postgresImage is hack/postgres-image.sh's image (CARVE_POSTGRES_IMAGE).
const postgresImage = "localhost/carve-test/postgres:15"

// pgdata is the data directory on the claim (a directory below the
// mount: ext4's lost+found is no place for a cluster).
const pgdata = "/data/pgdata"

// asPostgres runs a command as the image's postgres user: initdb, pg_ctl
// and pg_checksums refuse root.
const asPostgres = "setpriv --reuid=postgres --regid=postgres --init-groups "

// psql is a client on the server's socket in the same container.
const psql = "psql -h /tmp -U postgres -X -v ON_ERROR_STOP=1 -At "

// breakSwitch is a test-only switch that shows the checks fail:
// CARVE_DATABASES_BREAK=fsync-off runs every server with fsync off, with
// which a power cut (TestDatabasePowerCut) loses acknowledged commits.
func breakSwitch() string { return os.Getenv("CARVE_DATABASES_BREAK") }

// postgresScript makes the cluster at the first start (initdb with data
// checksums and the settings that matter), then starts the server and
// waits for it: a cluster restored from a snapshot starts as after a
// crash and replays its WAL before pg_ctl returns. The server runs under
// pg_ctl, not as the container's process, so that the checks can stop
// it (pg_checksums needs a stopped cluster) without the container ending.
func postgresScript(fsync string) string {
	return `set -eu
P=` + pgdata + `
if [ ! -s "$P/PG_VERSION" ]; then
	mkdir -p "$P"
	chown postgres:postgres "$P"
	chmod 700 "$P"
	` + asPostgres + `initdb --data-checksums --no-locale --encoding=UTF8 --auth=trust -U postgres -D "$P" >/tmp/initdb.log
	cat >>"$P/postgresql.conf" <<EOF
listen_addresses = '*'
port = $PGPORT
unix_socket_directories = '/tmp'
fsync = ` + fsync + `
synchronous_commit = on
full_page_writes = on
shared_buffers = 32MB
max_connections = 20
jit = off
EOF
	echo "host all all all trust" >>"$P/pg_hba.conf"
	# initdb syncs what it wrote, not these appends: a power cut soon
	# after would leave them zeros (ext4's delayed allocation).
	sync "$P/postgresql.conf" "$P/pg_hba.conf"
fi
# The lock file of a server that ran elsewhere (a snapshot's source, a
# killed container) names a process of another PID namespace; this
# container is the only one that runs a server on the claim (ReadWriteOnce).
rm -f "$P/postmaster.pid"
` + asPostgres + `pg_ctl -D "$P" -l /tmp/postgres.log -t 1200 -w start
exec sleep infinity
`
}

// postgresPod runs PostgreSQL on claim, on the guest node (a bed with a
// peer has another Node, where no kubelet runs pods). A live database's
// pod is on the guest's own network (hostNetwork) and listens on
// hostPort, one of the ports the host forwards, where its client
// outside reaches it; a restored one (hostPort 0) needs no client
// outside and listens on postgresPort in its own network. PGPORT tells
// the server and every psql and pgbench run in the container the port.
func postgresPod(ns, name, claim string, hostPort int) *corev1.Pod {
	port := hostPort
	if port == 0 {
		port = postgresPort
	}
	fsync := "on"
	if breakSwitch() == "fsync-off" {
		fsync = "off"
	}
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &zero,
			HostNetwork:                   hostPort != 0,
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": nodeName},
			Containers: []corev1.Container{{
				Name:            "postgres",
				Image:           postgresImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/sh", "-c", postgresScript(fsync)},
				Env:             []corev1.EnvVar{{Name: "PGPORT", Value: strconv.Itoa(port)}},
				VolumeMounts:    []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}

// pgExec runs a script in the pod's container, bounded by d, and returns
// its output (stdout and stderr).
func pgExec(ctx context.Context, ns, pod string, d time.Duration, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	argv := []string{"--kubeconfig", bed.Control.Kubeconfig, "exec", "-n", ns, pod, "--", "/bin/sh", "-c", script}
	out, err := exec.CommandContext(ctx, filepath.Join(bed.Config.BinDir, "kubectl"), argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s in %s/%s: %w: %s", firstLine(script), ns, pod, err, out)
	}
	return string(out), nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// startPostgres creates the pod and waits until its server answers.
func startPostgres(t *testing.T, ns string, pod *corev1.Pod) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := bed.Client.CoreV1().Pods(ns).Create(testCtx(t, time.Minute), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPostgres(t, ns, pod.Name)
	return time.Since(start)
}

// waitPostgres waits until the pod runs and its server answers.
func waitPostgres(t *testing.T, ns, pod string) {
	t.Helper()
	waitPodRunning(t, ns, pod, "")
	waitFor(t, 10*time.Minute, "PostgreSQL in "+pod+" answering", func(ctx context.Context) (bool, string, error) {
		out, err := pgExec(ctx, ns, pod, time.Minute, psql+"-c 'select 1'")
		if err != nil {
			log, _ := pgExec(ctx, ns, pod, time.Minute, "tail -n 3 /tmp/postgres.log")
			return false, fmt.Sprintf("%v; log: %s", err, log), nil
		}
		return strings.TrimSpace(out) == "1", out, nil
	})
}

// checkRecovered fails the test unless the server in pod started by
// replaying WAL, as after a crash, and logs what its log says of it.
func checkRecovered(t *testing.T, ns, pod string) {
	t.Helper()
	log, err := pgExec(testCtx(t, time.Minute), ns, pod, time.Minute, "grep -E 'redo|recover|interrupted|ready to accept' /tmp/postgres.log")
	t.Logf("%s: the server's log of its start:\n%s", pod, log)
	if err != nil || !strings.Contains(log, "redo starts") || !strings.Contains(log, "redo done") {
		t.Errorf("%s: the server did not start by replaying WAL, as it must on a volume as a crash left it (%v)", pod, err)
	}
}

// initBench fills pgbench's tables (scale 1: 100,000 accounts) and makes
// the client's table of acknowledged ids.
func initBench(t *testing.T, ns, pod string) {
	t.Helper()
	ctx := testCtx(t, 10*time.Minute)
	if _, err := pgExec(ctx, ns, pod, 10*time.Minute, "pgbench -h /tmp -U postgres -i -s 1 -q postgres 2>&1"); err != nil {
		t.Fatal(err)
	}
	if _, err := pgExec(ctx, ns, pod, time.Minute, psql+"-c 'create table acks (id bigint primary key, at timestamptz not null default now())'"); err != nil {
		t.Fatal(err)
	}
}

// bench is a pgbench run in the database's pod.
type bench struct {
	done chan struct{}
	out  string
	err  error
}

// startBench runs pgbench's TPC-B-like transactions for d with two
// clients. Its exit status is what says a client hit an error: pgbench
// ends non-zero when a client aborts.
func startBench(t *testing.T, ns, pod string, d time.Duration) *bench {
	t.Helper()
	b := &bench{done: make(chan struct{})}
	ctx := testCtx(t, d+10*time.Minute)
	go func() {
		defer close(b.done)
		b.out, b.err = pgExec(ctx, ns, pod, d+10*time.Minute,
			fmt.Sprintf("pgbench -h /tmp -U postgres -n -c 2 -j 2 -T %d -P 15 postgres 2>&1", int(d.Seconds())))
	}()
	return b
}

// wait waits for pgbench's end, fails the test if pgbench failed or
// counted a failed transaction, and logs its totals.
func (b *bench) wait(t *testing.T) {
	t.Helper()
	<-b.done
	if b.err != nil {
		t.Errorf("pgbench failed: %v", b.err)
	}
	for line := range strings.Lines(b.out) {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "number of failed transactions") && !strings.HasPrefix(line, "number of failed transactions: 0 "):
			t.Errorf("pgbench: %s", line)
		case strings.HasPrefix(line, "number of transactions actually processed"), strings.HasPrefix(line, "tps = "):
			t.Logf("pgbench: %s", line)
		}
	}
}

// ackWriter is the client outside the guest: it inserts ids 1, 2, 3, ...
// one transaction each (autocommit, synchronous_commit on) and records
// each one the server acknowledged.
type ackWriter struct {
	acks   pgcheck.Acks
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	errs   int
	first  error
	last   error
	lastID int64
}

func startAckWriter(t *testing.T, addr string) *ackWriter {
	t.Helper()
	w := &ackWriter{stop: make(chan struct{}), done: make(chan struct{})}
	url := "postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=20"
	go func() {
		defer close(w.done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background()) //nolint:errcheck // the writer is done either way
			}
		}()
		for id := int64(1); ; {
			select {
			case <-w.stop:
				return
			default:
			}
			if conn == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				c, err := pgx.Connect(ctx, url)
				cancel()
				if err != nil {
					w.fail(err)
					time.Sleep(time.Second)
					continue
				}
				conn = c
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, err := conn.Exec(ctx, "insert into acks (id) values ($1)", id)
			cancel()
			if err != nil {
				// Whether the server committed it is unknown: it is not
				// counted, and the next transaction takes a new id.
				w.fail(err)
				conn.Close(context.Background()) //nolint:errcheck // reconnecting
				conn = nil
				id++
				continue
			}
			w.acks.Add(id, time.Now())
			w.mu.Lock()
			w.lastID = id
			w.mu.Unlock()
			id++
		}
	}()
	return w
}

func (w *ackWriter) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs++
	if w.first == nil {
		w.first = err
	}
	w.last = err
}

// lastErr is the client's latest failure.
func (w *ackWriter) lastErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// finish stops the writer and fails the test if any of its transactions
// failed (every scenario here promises the database no error).
func (w *ackWriter) finish(t *testing.T) {
	t.Helper()
	close(w.stop)
	<-w.done
	if w.errs > 0 {
		t.Errorf("the client outside the guest saw %d failed transactions or connections; the first: %v", w.errs, w.first)
	}
	if w.acks.Len() == 0 {
		t.Error("the client outside the guest saw no transaction acknowledged")
	}
}

// checkDatabase runs every check on the database in pod: each id of
// acked is in it, pgbench's sums agree, pg_amcheck finds nothing in any
// database (heap and every index, with --heapallindexed), and, the server
// stopped, pg_checksums --check finds nothing. It leaves the server
// stopped.
func checkDatabase(t *testing.T, ns, pod string, acked []int64) {
	t.Helper()
	ctx := testCtx(t, 20*time.Minute)
	out, err := pgExec(ctx, ns, pod, 5*time.Minute, psql+"-c \""+pgcheck.BalancesQuery+"\"")
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgcheck.ParseBalances(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Check(); err != nil {
		t.Errorf("%s: %v", pod, err)
	}
	out, err = pgExec(ctx, ns, pod, 5*time.Minute, psql+"-c 'select id from acks'")
	if err != nil {
		t.Fatal(err)
	}
	present, err := pgcheck.ParseIDs(out)
	if err != nil {
		t.Fatal(err)
	}
	if missing := pgcheck.Missing(acked, present); len(missing) > 0 {
		t.Errorf("%s: %d of the %d acknowledged transactions are missing, e.g. ids %v", pod, len(missing), len(acked), missing[:min(len(missing), 10)])
	}
	// The server's notices are no finding: a second check of the same
	// cluster (TestDatabasePowerCut checks after each cut) gets one
	// saying the amcheck extension is already there.
	if out, err := pgExec(ctx, ns, pod, 15*time.Minute, "PGOPTIONS='-c client_min_messages=warning' pg_amcheck -h /tmp -U postgres --all --heapallindexed --install-missing 2>&1"); err != nil {
		t.Errorf("%s: pg_amcheck: %v", pod, err)
	} else if strings.TrimSpace(out) != "" {
		t.Errorf("%s: pg_amcheck said: %s", pod, out)
	}
	if _, err := pgExec(ctx, ns, pod, 5*time.Minute, asPostgres+"pg_ctl -D "+pgdata+" -m fast -w -t 600 stop"); err != nil {
		t.Fatal(err)
	}
	if out, err := pgExec(ctx, ns, pod, 10*time.Minute, asPostgres+"pg_checksums --check -D "+pgdata+" 2>&1"); err != nil {
		t.Errorf("%s: pg_checksums --check: %v", pod, err)
	} else if !strings.Contains(out, "Bad checksums:  0") {
		t.Errorf("%s: pg_checksums --check said: %s", pod, out)
	}
	t.Logf("%s: the %d acknowledged ids checked present (the table holds %d), pgbench's sums agree (%d), pg_amcheck and pg_checksums clean", pod, len(acked), len(present), b.History)
}

// liveDatabase makes a claim and a PostgreSQL on it reachable from the
// host, fills pgbench's tables and returns the host's address of the
// server.
func liveDatabase(t *testing.T, ns, sc, size string) string {
	t.Helper()
	addr := bed.GuestNode(nodeName).HostPorts[postgresPort]
	if addr == "" {
		t.Fatal("the guest node forwards no port to PostgreSQL: run make test-databases (CARVE_POSTGRES_IMAGE)")
	}
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(testCtx(t, time.Minute), newPVC(ns, "data", sc, size), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := startPostgres(t, ns, postgresPod(ns, "pg", "data", postgresPort))
	t.Logf("PostgreSQL answering %s after its pod was created", took.Round(time.Second))
	initBench(t, ns, "pg")
	return addr
}

// acksBeforeSnapshot is how many of the client's transactions are
// acknowledged before the snapshot is asked for: enough that the restore
// has something to hold (at the 50 to 110 a second the client gets on the
// emulated guest, 10 to 20 s, while pgbench writes beside it).
const acksBeforeSnapshot = 1000

// busyDatabase is liveDatabase on a 1Gi claim of sc in ns, under an
// acknowledging writer and 90 s of pgbench, once acksBeforeSnapshot
// writes are acknowledged.
func busyDatabase(t *testing.T, ns, sc string) (*ackWriter, *bench) {
	t.Helper()
	addr := liveDatabase(t, ns, sc, "1Gi")
	w := startAckWriter(t, addr)
	b := startBench(t, ns, "pg", 90*time.Second)
	waitAcked(t, w, acksBeforeSnapshot)
	return w, b
}

// waitAcked waits until the client has had n transactions acknowledged.
func waitAcked(t *testing.T, w *ackWriter, n int) {
	t.Helper()
	waitFor(t, podTimeout, fmt.Sprintf("%d transactions acknowledged to the client", n), func(context.Context) (bool, string, error) {
		got := w.acks.Len()
		return got >= n, fmt.Sprintf("%d acknowledged; the client's last error: %v", got, w.lastErr()), nil
	})
}

// TestDatabaseSnapshotOfTheLiveDatabase: a VolumeSnapshot taken while
// pgbench and the client write; a claim restored from it on the same
// node; PostgreSQL started there recovers by itself (WAL replay) and
// holds every transaction acknowledged before the snapshot was asked for.
// Thick (ext4) and thin (xfs).
func TestDatabaseSnapshotOfTheLiveDatabase(t *testing.T) {
	dc := dynamicClient(t)
	for _, sc := range []string{thickSC, thinSC} {
		t.Run(sc, func(t *testing.T) {
			began := time.Now()
			ns := newNamespace(t, "pgsnap")
			w, b := busyDatabase(t, ns, sc)

			t.Cleanup(func() { deleteSnapshot(t, dc, ns, "snap") })
			asked := time.Now()
			ctx := testCtx(t, 10*time.Minute)
			if err := kubetest.CreateVolumeSnapshot(ctx, dc, ns, "snap", snapshotClass, "data"); err != nil {
				t.Fatal(err)
			}
			waitSnapshotReady(t, dc, ns, "snap")
			ready := time.Since(asked)
			before := w.acks.Before(asked)
			b.wait(t)
			w.finish(t)
			all := w.acks.All()

			restored := newPVC(ns, "restored", sc, "1Gi")
			group := "snapshot.storage.k8s.io"
			restored.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
			if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, restored, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			recovered := startPostgres(t, ns, postgresPod(ns, "pg-restored", "restored", 0))
			checkRecovered(t, ns, "pg-restored")

			checkDatabase(t, ns, "pg", all)
			checkDatabase(t, ns, "pg-restored", before)
			t.Logf("MEASURE database snapshot %s: %s in all; snapshot ReadyToUse %s after asked; restored server answering %s after its pod; %d acknowledged ids checked on the source, %d (acknowledged before the snapshot) on the restore",
				sc, time.Since(began).Round(time.Second), ready.Round(time.Second), recovered.Round(time.Second), len(all), len(before))
		})
	}
}

// TestDatabaseOnlineExpansionUnderLoad: the claim grows from 1 Gi to
// 2 Gi while pgbench and the client write; no transaction fails and the
// container's filesystem shows the new size.
func TestDatabaseOnlineExpansionUnderLoad(t *testing.T) {
	began := time.Now()
	ns := newNamespace(t, "pggrow")
	addr := liveDatabase(t, ns, thickSC, "1Gi")
	sizeBefore, _ := dfBytes(t, ns, "pg", "/data")
	w := startAckWriter(t, addr)
	b := startBench(t, ns, "pg", 90*time.Second)
	time.Sleep(20 * time.Second)
	ctx := testCtx(t, 10*time.Minute)
	patch := []byte(`{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`)
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	waitFor(t, podTimeout, "the claim's status capacity at 2Gi", func(ctx context.Context) (bool, string, error) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		got := c.Status.Capacity[corev1.ResourceStorage]
		return got.Cmp(resource.MustParse("2Gi")) == 0, fmt.Sprintf("capacity %s", got.String()), nil
	})
	var sizeAfter int64
	waitFor(t, podTimeout, "df in the container showing the grown filesystem", func(ctx context.Context) (bool, string, error) {
		sizeAfter, _ = dfBytes(t, ns, "pg", "/data")
		return sizeAfter > sizeBefore+900<<20, fmt.Sprintf("df size %d bytes (was %d)", sizeAfter, sizeBefore), nil
	})
	grown := time.Since(asked)
	b.wait(t)
	w.finish(t)
	all := w.acks.All()
	checkDatabase(t, ns, "pg", all)
	t.Logf("MEASURE database online expansion: %s in all; the container's df %d -> %d bytes %s after the claim was patched; %d acknowledged ids checked",
		time.Since(began).Round(time.Second), sizeBefore, sizeAfter, grown.Round(time.Second), len(all))
}

// TestDatabaseSurvivesKilledCarve: carve's node agent and its controller
// processes are killed with SIGKILL, three times each, while pgbench and
// the client write; no transaction fails and none acknowledged is lost.
func TestDatabaseSurvivesKilledCarve(t *testing.T) {
	began := time.Now()
	ns := newNamespace(t, "pgkill")
	addr := liveDatabase(t, ns, thinSC, "1Gi")
	w := startAckWriter(t, addr)
	b := startBench(t, ns, "pg", 3*time.Minute)
	const rounds = 3
	for i := range rounds {
		time.Sleep(10 * time.Second)
		killAndWait(t, "node agent", labels.Set{"app.kubernetes.io/component": "node"}, "pkill -KILL -f '^/usr/local/bin/carve-node node'")
		killAndWait(t, "controller", labels.Set{"app.kubernetes.io/component": "controller"}, "pkill -KILL -f '^/usr/local/bin/carve controller'")
		t.Logf("round %d: node agent and controller killed and running again; %d transactions acknowledged so far", i+1, w.acks.Len())
	}
	b.wait(t)
	w.finish(t)
	all := w.acks.All()
	checkDatabase(t, ns, "pg", all)
	t.Logf("MEASURE database kills: %d SIGKILLs of the node agent and of the controller; %s in all; %d acknowledged ids checked",
		rounds, time.Since(began).Round(time.Second), len(all))
}

// killAndWait runs kill on the guest and waits until every carve pod of
// sel on the guest has its carve container restarted and running.
func killAndWait(t *testing.T, what string, sel labels.Set, kill string) {
	t.Helper()
	sel["app.kubernetes.io/name"] = "carve"
	restarts := func(ctx context.Context) (map[string]int32, string, error) {
		pods, err := bed.Client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String(), FieldSelector: "spec.nodeName=" + nodeName})
		if err != nil {
			return nil, "", err
		}
		if len(pods.Items) == 0 {
			return nil, "", errors.New("no carve " + what + " pod on " + nodeName)
		}
		n := map[string]int32{}
		state := ""
		for i := range pods.Items {
			c := containerStatus(&pods.Items[i], "carve")
			if c == nil {
				return nil, "", fmt.Errorf("pod %s has no carve container", pods.Items[i].Name)
			}
			if c.State.Running == nil {
				n[pods.Items[i].Name] = -1
			} else {
				n[pods.Items[i].Name] = c.RestartCount
			}
			state += pods.Items[i].Name + ": " + podState(&pods.Items[i]) + "; "
		}
		return n, state, nil
	}
	before, _, err := restarts(testCtx(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	guestExec(t, kill)
	waitFor(t, podTimeout, "the carve "+what+" restarted and running", func(ctx context.Context) (bool, string, error) {
		now, state, err := restarts(ctx)
		if err != nil {
			return notYet(err)
		}
		for name, r := range before {
			if now[name] <= r {
				return false, state, nil
			}
		}
		return true, state, nil
	})
}

// A powerCut is one of TestDatabasePowerCut's cuts: during starts the
// operation the cut interrupts and returns the guest's shell condition
// whose first truth is the moment of the cut (a plain cut under load has
// none), and converged, run once the database is back, waits until that
// operation has ended and checks that it left no stray LV.
type powerCut struct {
	name string
	// load is how long pgbench runs before the cut (with during: before
	// the operation starts).
	load   time.Duration
	during func(t *testing.T, c *cutScenario) string
	// fromInside: the guest cuts its own power (sysrq b: reboot at once,
	// nothing synced) the moment during's condition holds; the host's
	// polling of a guest command takes too long to land inside an
	// operation of one lvcreate.
	fromInside bool
	// atCut says, from the API (the node is down), how far the
	// operation had come at the cut: that it was cut mid-way.
	atCut     func(ctx context.Context, c *cutScenario) string
	converged func(t *testing.T, c *cutScenario)
}

// cutScenario is the state TestDatabasePowerCut's cuts share.
type cutScenario struct {
	ns string
	dc dynamic.Interface
	// lvs are the guest's LVs ("vg/lv" a line, sorted) before the
	// operation a cut interrupts.
	lvs string
	// size is the filesystem's size in the container before the
	// expansion.
	size int64
}

// guestLVs lists the guest's LVs, "vg/lv" a line, sorted.
func guestLVs(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(guestExec(t, "lvs --noheadings -o vg_name,lv_name | awk '{print $1 \"/\" $2}' | sort"))
}

// newLVs checks that the guest's LVs are those of before plus exactly
// want more (none gone), and returns the new ones.
func newLVs(t *testing.T, before string, want int) []string {
	t.Helper()
	was := map[string]bool{}
	for _, lv := range strings.Fields(before) {
		was[lv] = true
	}
	var added []string
	for _, lv := range strings.Fields(guestLVs(t)) {
		if !was[lv] {
			added = append(added, lv)
		}
		delete(was, lv)
	}
	if len(added) != want || len(was) != 0 {
		t.Errorf("the guest's LVs after the operation the cut interrupted: new %v (want %d), gone %v (want none)", added, want, was)
	}
	return added
}

// lvCountAbove is a guest condition: the guest has more LVs than before.
func lvCountAbove(before string) string {
	return fmt.Sprintf("[ $(lvs --noheadings -o lv_name | wc -l) -gt %d ]", len(strings.Fields(before)))
}

// powerCuts are TestDatabasePowerCut's five cuts, in order, on the one
// live database: two under plain load, and one in each of the three
// operations on a node that can be half done when its power goes (its LV
// made, its answer not yet recorded).
var powerCuts = []powerCut{{
	name: "under load",
	load: 30 * time.Second,
}, {
	// A CreateVolume: a new claim's pod created; the cut comes as soon as
	// lvcreate has made its LV, before the PV is recorded.
	name: "during a CreateVolume",
	load: 10 * time.Second,
	during: func(t *testing.T, c *cutScenario) string {
		c.lvs = guestLVs(t)
		pod := newPod(c.ns, "other", "other", false, sleeper)
		pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": nodeName}
		kubetest.CreateClaimAndPod(t, testCtx(t, time.Minute), bed.Client, newPVC(c.ns, "other", thickSC, "1Gi"), pod)
		return lvCountAbove(c.lvs)
	},
	atCut: func(ctx context.Context, c *cutScenario) string {
		pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, "other", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		return fmt.Sprintf("the new claim %s (volume %q)", pvc.Status.Phase, pvc.Spec.VolumeName)
	},
	converged: func(t *testing.T, c *cutScenario) {
		pv := waitClaimBound(t, c.ns, "other", 2*podTimeout)
		waitPodRunning(t, c.ns, "other", "")
		added := newLVs(t, c.lvs, 1)
		if h := volumeHandle(t, pv); len(added) == 1 && added[0] != h {
			t.Errorf("the new claim's PV %s has volume %s, but the LV made is %s", pv, h, added[0])
		}
	},
}, {
	// A snapshot of the live claim: the guest cuts its power as soon as
	// lvcreate has made the snapshot's first device-mapper device, before
	// the VolumeSnapshot is ReadyToUse (a thick snapshot is one lvcreate).
	name:       "during a snapshot",
	load:       10 * time.Second,
	fromInside: true,
	during: func(t *testing.T, c *cutScenario) string {
		c.lvs = guestLVs(t)
		devices := strings.TrimSpace(guestExec(t, "set -- /dev/mapper/*; echo $#"))
		t.Cleanup(func() { deleteSnapshot(t, c.dc, c.ns, "snap") })
		if err := kubetest.CreateVolumeSnapshot(testCtx(t, time.Minute), c.dc, c.ns, "snap", snapshotClass, "data"); err != nil {
			t.Fatal(err)
		}
		// Shell builtins only: a poll that runs no command (lvs would wait
		// for lvcreate's lock) sees the device within milliseconds.
		return "set -- /dev/mapper/*; [ $# -gt " + devices + " ]"
	},
	atCut: func(ctx context.Context, c *cutScenario) string {
		vs, err := c.dc.Resource(kubetest.VolumeSnapshots).Namespace(c.ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		status, _, _ := unstructured.NestedMap(vs.Object, "status")
		return fmt.Sprintf("the VolumeSnapshot's status %v", status)
	},
	converged: func(t *testing.T, c *cutScenario) {
		waitSnapshotReady(t, c.dc, c.ns, "snap")
		// The cut comes between lvcreate's two commits: what is left is
		// the copy-on-write store as a plain LV, which must not pass for
		// the ready snapshot.
		for _, lv := range newLVs(t, c.lvs, 1) {
			if attr := strings.TrimSpace(guestExec(t, "lvs --noheadings -o lv_attr "+lv)); !strings.HasPrefix(attr, "s") {
				t.Errorf("the ready snapshot's LV %s has lv_attr %q: not a copy-on-write snapshot", lv, attr)
			}
		}
	},
}, {
	// An online expansion from 1 Gi to 2 Gi: the cut comes as soon as
	// lvextend has grown the LV, before the filesystem is grown.
	name: "during an expansion",
	load: 10 * time.Second,
	during: func(t *testing.T, c *cutScenario) string {
		c.lvs = guestLVs(t)
		c.size, _ = dfBytes(t, c.ns, "pg", "/data")
		handle := volumeHandle(t, pvOf(t, c.ns, "data"))
		patch := []byte(`{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`)
		if _, err := bed.Client.CoreV1().PersistentVolumeClaims(c.ns).Patch(testCtx(t, time.Minute), "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("[ $(lvs --noheadings --units b --nosuffix -o lv_size %s) -gt %d ]", handle, 1<<30)
	},
	atCut: func(ctx context.Context, c *cutScenario) string {
		pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		got := pvc.Status.Capacity[corev1.ResourceStorage]
		return fmt.Sprintf("the claim's capacity %s, its conditions %v", got.String(), pvc.Status.Conditions)
	},
	converged: func(t *testing.T, c *cutScenario) {
		waitFor(t, 2*podTimeout, "the claim's status capacity at 2Gi", func(ctx context.Context) (bool, string, error) {
			pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(c.ns).Get(ctx, "data", metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			got := pvc.Status.Capacity[corev1.ResourceStorage]
			return got.Cmp(resource.MustParse("2Gi")) == 0, fmt.Sprintf("capacity %s; conditions %v", got.String(), pvc.Status.Conditions), nil
		})
		waitFor(t, podTimeout, "df in the container showing the grown filesystem", func(ctx context.Context) (bool, string, error) {
			size, _ := dfBytes(t, c.ns, "pg", "/data")
			return size > c.size+900<<20, fmt.Sprintf("df size %d bytes (was %d)", size, c.size), nil
		})
		newLVs(t, c.lvs, 0)
	},
}, {
	// Under load again, soon after the server came back from the last
	// cut and its checks.
	name: "under load, soon after a restart",
	load: 5 * time.Second,
}}

// TestDatabasePowerCut: the guest node's qemu process is killed
// (guestnode.Node.PowerCut: a power cut; the guest's page cache is lost,
// what it wrote to its disks stays) while pgbench and the client write,
// five times (powerCuts): twice under plain load and once in the middle
// of each of a CreateVolume, a snapshot and an online expansion. After
// each cut the node boots again from the same disks; the pod runs again
// on the same claim, PostgreSQL recovers by itself (WAL replay), the
// client's transactions are acknowledged again, the interrupted
// operation converges (the claim binds, the snapshot becomes ready, the
// expansion reaches the container) leaving no stray LV, and every check
// passes with every transaction acknowledged so far. pgbench and the
// client fail while the node is down: that is the cut, not an error of
// the database.
func TestDatabasePowerCut(t *testing.T) {
	began := time.Now()
	dc := dynamicClient(t)
	c := &cutScenario{ns: newNamespace(t, "pgcut"), dc: dc}
	addr := liveDatabase(t, c.ns, thickSC, "1Gi")
	w := startAckWriter(t, addr)
	only, err := cutsFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	for i, pc := range powerCuts {
		if only != nil && !only[i+1] {
			continue
		}
		ok := t.Run(pc.name, func(t *testing.T) {
			startBench(t, c.ns, "pg", 10*time.Minute)
			time.Sleep(pc.load)
			moment := ""
			if pc.during != nil {
				moment = pc.during(t, c)
			}
			back := cutAndRecover(t, c, w, moment, pc.fromInside, pc.atCut)
			if pc.converged != nil {
				pc.converged(t, c)
			}
			all := w.acks.All()
			checkDatabase(t, c.ns, "pg", all)
			if _, err := pgExec(testCtx(t, 10*time.Minute), c.ns, "pg", 10*time.Minute, asPostgres+"pg_ctl -D "+pgdata+" -l /tmp/postgres.log -t 600 -w start"); err != nil {
				t.Fatal(err)
			}
			t.Logf("MEASURE database power cut %d (%s): the server answering again %s after the cut; %d acknowledged ids checked; %s since the test began",
				i+1, pc.name, back.Round(time.Second), len(all), time.Since(began).Round(time.Second))
		})
		if !ok {
			break
		}
	}
	close(w.stop)
	<-w.done
	t.Logf("the client saw %d failed transactions or connections around the cuts and checks (the first: %v)", w.errs, w.first)
	t.Logf("MEASURE database power cuts: %s in all; %d acknowledged ids", time.Since(began).Round(time.Second), w.acks.Len())
}

// cutsFromEnv reads CARVE_DATABASES_CUTS, the numbers (from 1, in
// powerCuts' order) of the cuts to make, comma-separated: each cut takes
// 4 to 5 minutes on the emulated node, and one alone can be run again
// (make test-databases DATABASES_CUTS=3,4). Unset: every cut (nil).
func cutsFromEnv() (map[int]bool, error) {
	v := os.Getenv("CARVE_DATABASES_CUTS")
	if v == "" {
		return nil, nil
	}
	only := map[int]bool{}
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > len(powerCuts) {
			return nil, fmt.Errorf("CARVE_DATABASES_CUTS=%q: want numbers of cuts from 1 to %d, comma-separated", v, len(powerCuts))
		}
		only[n] = true
	}
	return only, nil
}

// cutAndRecover cuts the guest's power (as soon as the guest's shell
// condition moment holds, when set; from inside the guest when
// fromInside; atCut, when set, is logged then), boots it again, and waits until the pod pg runs a new container, its
// server answers after WAL replay and the client has transactions
// acknowledged again. It returns the time from the cut to the server
// answering.
func cutAndRecover(t *testing.T, c *cutScenario, w *ackWriter, moment string, fromInside bool, atCut func(context.Context, *cutScenario) string) time.Duration {
	t.Helper()
	ns := c.ns
	g := bed.GuestNode(nodeName)
	switch {
	case fromInside:
		// The command never ends: the guest is gone first.
		_, err := g.Exec(testCtx(t, 5*time.Minute), "until "+moment+"; do sleep 0.01; done; echo 1 > /proc/sys/kernel/sysrq; echo b > /proc/sysrq-trigger; sleep 60")
		if err == nil || !strings.Contains(err.Error(), "the guest ended") {
			t.Fatalf("the guest's own power cut at (%s): %v, want the guest ended", moment, err)
		}
	case moment != "":
		if _, err := g.Exec(testCtx(t, 5*time.Minute), "until "+moment+"; do sleep 0.05; done"); err != nil {
			t.Fatalf("waiting for the moment of the cut (%s): %v", moment, err)
		}
	}
	acked := w.acks.Len()
	cut := time.Now()
	g.PowerCut()
	t.Logf("power cut after %d acknowledged transactions", acked)
	if atCut != nil {
		t.Logf("at the cut: %s", atCut(testCtx(t, time.Minute), c))
	}
	if err := g.Boot(testCtx(t, 15*time.Minute), bed.Client); err != nil {
		t.Fatalf("boot again: %v", err)
	}
	waitFor(t, 2*podTimeout, "the PostgreSQL pod running again after the cut", func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "pg", metav1.GetOptions{})
		if err != nil {
			return notYet(err)
		}
		st := containerStatus(p, "postgres")
		started := st != nil && st.State.Running != nil && st.State.Running.StartedAt.After(cut)
		return allRunning(p) && started, podState(p), nil
	})
	waitFor(t, 10*time.Minute, "PostgreSQL answering after the cut", func(ctx context.Context) (bool, string, error) {
		out, err := pgExec(ctx, ns, "pg", time.Minute, psql+"-c 'select 1'")
		if err != nil {
			return notYet(err)
		}
		return strings.TrimSpace(out) == "1", out, nil
	})
	back := time.Since(cut)
	waitFor(t, 5*time.Minute, "the client's transactions acknowledged again", func(context.Context) (bool, string, error) {
		n := len(w.acks.Before(time.Now())) - len(w.acks.Before(cut))
		return n >= 20, fmt.Sprintf("%d acknowledged since the cut; the client's last error: %v", n, w.lastErr()), nil
	})
	checkRecovered(t, ns, "pg")
	return back
}
