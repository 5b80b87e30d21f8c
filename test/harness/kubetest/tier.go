package kubetest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/test/harness/cluster"
)

// Tier is how a tier's TestMain brings up its test bed, says what runs on
// it, and checks what the teardown left.
type Tier struct {
	// Name prefixes the lines the tier prints ("e2e", "nodes").
	Name string
	// Config reads the test bed's configuration from the environment.
	Config func() (cluster.Config, error)
	// Ready, when set, waits until the started bed can take the tests.
	Ready func(ctx context.Context, bed *cluster.Cluster) error
	// Up prints what runs on the ready bed, which took took to start.
	Up func(bed *cluster.Cluster, took time.Duration)
	// DumpLines is how many of each log's last lines a failure prints.
	DumpLines int
	// AfterStop, when set, checks what the teardown should have left
	// clean; its error fails the run.
	AfterStop func(bed *cluster.Cluster) error
	// Finale, when set, is the tests that run after every other one, in
	// its order.
	Finale *Finale
}

// Main is a tier's TestMain: it parses the flags (klog's among them),
// starts the test bed into *bed, where the tests find it, runs the tests
// and tears the bed down. The logs are printed when anything failed; the
// run directory is removed when everything passed and kept (and named)
// when not. It returns the exit code.
func (tr Tier) Main(m *testing.M, bed **cluster.Cluster) int {
	klog.InitFlags(nil)
	flag.Parse()
	if tr.Finale != nil {
		if err := tr.Finale.makeRoom(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: the %s tier's finale: %v\n", tr.Name, err)
			return 1
		}
	}
	cfg, err := tr.Config()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: the %s tier cannot run: %v\n", tr.Name, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Lifetime)
	defer cancel()
	start := time.Now()
	b, err := cluster.Start(ctx, cfg)
	*bed = b
	if err == nil && tr.Ready != nil {
		err = tr.Ready(ctx, b)
	}
	if err != nil {
		fail := fmt.Sprintf("FAIL: starting the %s test bed: %v", tr.Name, err)
		if b != nil {
			if aerr := b.CheckAlive(); aerr != nil {
				fail += fmt.Sprintf("\n(and %v)", aerr)
			}
		}
		fmt.Fprintln(os.Stderr, fail)
		if b != nil {
			b.DumpLogs(tr.DumpLines)
			if serr := b.Stop(); serr != nil {
				fmt.Fprintf(os.Stderr, "teardown: %v\n", serr)
			}
			// Said again below the logs: a CI report shows a run's last
			// lines, and the logs would push the reason out of them.
			fmt.Fprintln(os.Stderr, fail)
		}
		return 1
	}
	tr.Up(b, time.Since(start).Round(time.Millisecond))
	fmt.Printf("%s: run directory (logs, kubeconfig) %s\n", tr.Name, b.Config.RunDir)

	code := m.Run()
	if code != 0 {
		b.DumpLogs(tr.DumpLines)
	}
	if err := b.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: tearing the test bed down: %v\n", err)
		code = 1
	}
	if tr.AfterStop != nil {
		if err := tr.AfterStop(b); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: after teardown: %v\n", err)
			code = 1
		}
	}
	if code == 0 {
		if err := os.RemoveAll(b.Config.RunDir); err != nil {
			fmt.Fprintf(os.Stderr, "%s: removing the run directory: %v\n", tr.Name, err)
		}
	} else {
		fmt.Fprintf(os.Stderr, "%s: logs kept in %s\n", tr.Name, b.Config.RunDir)
	}
	return code
}

// CreateClaimAndPod creates the claim pvc and then pod, failing the test
// if either is refused.
func CreateClaimAndPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, pvc *corev1.PersistentVolumeClaim, pod *corev1.Pod) {
	t.Helper()
	if _, err := cs.CoreV1().PersistentVolumeClaims(pvc.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PVC %s: %v", pvc.Name, err)
	}
	if _, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
}
