package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/test/harness/cluster"
)

// tpsWindow is the span the table's transactions per second cover.
const tpsWindow = time.Minute

// dbSampleEvery is how often the demo reads the databases' counters: a
// kubectl exec each, which the emulated guest pays for.
const dbSampleEvery = 15 * time.Second

// sampleQuery reads, in one statement, what the table shows of the
// database pgbench writes to: the transactions committed in it so far and
// its size in bytes. The counter is the server's own, so it counts what
// PostgreSQL committed whoever the client was.
const sampleQuery = "select xact_commit, pg_database_size(datname) from pg_stat_database where datname = 'postgres'"

// dbSample is one reading of a database's counters.
type dbSample struct {
	At time.Time
	// Commits is pg_stat_database.xact_commit: transactions committed
	// since the server's statistics were last reset.
	Commits int64
	// Size is pg_database_size, in bytes.
	Size int64
}

// parseSample reads psql's unaligned output of sampleQuery (-At -F ' ').
func parseSample(out string, at time.Time) (dbSample, error) {
	f := strings.Fields(out)
	if len(f) != 2 {
		return dbSample{}, fmt.Errorf("psql printed %q, want two numbers", out)
	}
	commits, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return dbSample{}, fmt.Errorf("xact_commit %q: %w", f[0], err)
	}
	size, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return dbSample{}, fmt.Errorf("pg_database_size %q: %w", f[1], err)
	}
	return dbSample{At: at, Commits: commits, Size: size}, nil
}

// dbHistory is one database's samples, oldest first.
type dbHistory []dbSample

// add appends s and drops the samples that no window ending at s needs
// (one older than window is kept as the window's base).
func (h dbHistory) add(s dbSample, window time.Duration) dbHistory {
	h = append(h, s)
	first := 0
	for i := range h {
		if s.At.Sub(h[i].At) >= window {
			first = i
		}
	}
	return h[first:]
}

// dbColumns turns a database's samples (oldest first) into the table's
// two columns: its size at the latest sample, and the transactions
// committed per second from the latest sample at least window before
// the latest one up to the latest. While the samples span less than
// window, the rate covers what they span and says over how long. A
// counter that went down is a server whose statistics were reset (a
// crash discards them): only the samples since then count.
func dbColumns(samples []dbSample, window time.Duration) (size, tps string) {
	if len(samples) == 0 {
		return "-", "-"
	}
	last := samples[len(samples)-1]
	size = fmt.Sprintf("%.1fMi", float64(last.Size)/(1<<20))
	since := 0
	for i := 1; i < len(samples); i++ {
		if samples[i].Commits < samples[i-1].Commits {
			since = i
		}
	}
	base := samples[since]
	for _, s := range samples[since:] {
		if last.At.Sub(s.At) >= window {
			base = s
		}
	}
	span := last.At.Sub(base.At)
	if span <= 0 {
		return size, "measuring"
	}
	tps = fmt.Sprintf("%.1f", float64(last.Commits-base.Commits)/span.Seconds())
	if span < window {
		tps += fmt.Sprintf(" (over %s)", span.Round(time.Second))
	}
	return size, tps
}

// sampleDB reads the counters of the PostgreSQL in the pod with psql on
// its socket (kubectl exec through the apiserver and the kubelet).
func sampleDB(ctx context.Context, bed *cluster.Cluster, ns, pod string) (dbSample, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	kubectl := filepath.Join(bed.Config.BinDir, "kubectl")
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", bed.Control.Kubeconfig, "exec", "-n", ns, pod, "--",
		"psql", "-h", "/tmp", "-U", "postgres", "-X", "-At", "-F", " ", "-c", sampleQuery).Output()
	if err != nil {
		return dbSample{}, fmt.Errorf("kubectl exec psql in %s/%s: %w", ns, pod, err)
	}
	return parseSample(string(out), time.Now())
}

// databases samples the PostgreSQL servers of the demo's db pods.
type databases struct {
	bed     *cluster.Cluster
	ns      string
	pods    []string
	history map[string]dbHistory
}

// startDatabases finds db's pods (sorted by name) and reads each
// database's counters once.
func startDatabases(ctx context.Context, bed *cluster.Cluster, ns string) (*databases, error) {
	pods, err := bed.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=db"})
	if err != nil {
		return nil, err
	}
	d := &databases{bed: bed, ns: ns, history: map[string]dbHistory{}}
	for _, p := range pods.Items {
		d.pods = append(d.pods, p.Name)
	}
	if len(d.pods) == 0 {
		return nil, fmt.Errorf("no db pods in namespace %s", ns)
	}
	sort.Strings(d.pods)
	if err := d.sample(ctx); err != nil {
		fmt.Printf("(%v)\n", err)
	}
	return d, nil
}

// measure samples the databases every dbSampleEvery until the first
// sample is d old, so that the table's TPS covers d.
func (d *databases) measure(ctx context.Context, span time.Duration) error {
	end := time.Now().Add(span)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(dbSampleEvery, time.Until(end))):
		}
		if err := d.sample(ctx); err != nil {
			fmt.Printf("(%v)\n", err)
		}
	}
	return nil
}

// sample reads every database once; a database that does not answer is
// named in the error and keeps its earlier samples.
func (d *databases) sample(ctx context.Context) error {
	var failed []string
	for _, p := range d.pods {
		s, err := sampleDB(ctx, d.bed, d.ns, p)
		if err != nil {
			failed = append(failed, err.Error())
			continue
		}
		d.history[p] = d.history[p].add(s, tpsWindow)
	}
	if len(failed) > 0 {
		return fmt.Errorf("sampling the databases: %s", strings.Join(failed, "; "))
	}
	return nil
}

// columns are the table's size and TPS columns for pod ("-" for a pod
// that runs no database).
func (d *databases) columns(pod string) (size, tps string) {
	return dbColumns(d.history[pod], tpsWindow)
}

// line is one line of every database's size and TPS, printed each
// minute while the demo stays up.
func (d *databases) line(now time.Time) string {
	parts := make([]string, 0, len(d.pods))
	for _, p := range d.pods {
		size, tps := d.columns(p)
		parts = append(parts, fmt.Sprintf("%s %s, %s TPS", p, size, tps))
	}
	return now.UTC().Format("15:04:05") + "  " + strings.Join(parts, "   ")
}
