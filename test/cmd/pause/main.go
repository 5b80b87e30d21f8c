// Command pause is the sandbox ("pause") container of the guest test bed's
// pods, packed by hack/images.sh as registry.k8s.io/pause:3.10, the image
// containerd's CRI is configured to use: no registry is reachable there.
// Like the upstream pause it holds the pod's namespaces open: it sleeps
// until SIGINT or SIGTERM and then exits 0, and, being PID 1 of the pod,
// reaps every child that is re-parented to it. Build it static
// (CGO_ENABLED=0).
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	os.Exit(wait(sigs, reap))
}

// wait handles signals until one asks to stop: SIGCHLD reaps, SIGINT and
// SIGTERM end with exit code 0.
func wait(sigs <-chan os.Signal, reapAll func() ([]int, error)) int {
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			if _, err := reapAll(); err != nil {
				fmt.Fprintf(os.Stderr, "pause: reaping: %v\n", err)
			}
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: shutting down on %v\n", sig)
		return 0
	}
	return 0
}

// reap collects every child that has exited, without blocking, and returns
// their pids. Several exits can arrive as one SIGCHLD, hence the loop.
func reap() ([]int, error) {
	var pids []int
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ECHILD):
			return pids, nil
		case err != nil:
			return pids, fmt.Errorf("wait4: %w", err)
		case pid <= 0:
			return pids, nil
		}
		pids = append(pids, pid)
	}
}
