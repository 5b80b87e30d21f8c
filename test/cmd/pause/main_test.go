package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStopsOnSignal builds the program and stops it with each signal a
// runtime sends; it must exit 0 and not before the signal.
func TestStopsOnSignal(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "pause")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				t.Fatalf("exited before any signal: %v", err)
			case <-time.After(300 * time.Millisecond):
			}
			// SIGCHLD with nothing to reap must not stop it either.
			if err := cmd.Process.Signal(syscall.SIGCHLD); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				t.Fatalf("exited on SIGCHLD: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("exit: %v (stderr %q), want 0", err, stderr.String())
				}
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("still running 10 s after the signal")
			}
		})
	}
}

// TestReap: exited children are collected (no zombie stays), and with none
// left reap returns at once.
func TestReap(t *testing.T) {
	var started []int
	for range 3 {
		// The test binary with no test to run exits at once.
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		started = append(started, cmd.Process.Pid)
	}
	var reaped []int
	deadline := time.Now().Add(10 * time.Second)
	for len(reaped) < len(started) && time.Now().Before(deadline) {
		pids, err := reap()
		if err != nil {
			t.Fatal(err)
		}
		reaped = append(reaped, pids...)
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(started)
	slices.Sort(reaped)
	if !slices.Equal(started, reaped) {
		t.Errorf("reaped %v, want %v", reaped, started)
	}
	for _, pid := range started {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pid %d is still in /proc after reaping (%v)", pid, err)
		}
	}
	if pids, err := reap(); err != nil || len(pids) != 0 {
		t.Errorf("reap with no children: %v, %v; want nothing", pids, err)
	}
}

// TestWait: SIGCHLD reaps and goes on; SIGINT or SIGTERM end with 0.
func TestWait(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sigs  []os.Signal
		reaps int
	}{
		{"term at once", []os.Signal{syscall.SIGTERM}, 0},
		{"children first", []os.Signal{syscall.SIGCHLD, syscall.SIGCHLD, syscall.SIGINT}, 2},
		{"a failed reap does not stop it", []os.Signal{syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGCHLD}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := make(chan os.Signal, len(tc.sigs))
			for _, s := range tc.sigs {
				ch <- s
			}
			reaps := 0
			code := wait(ch, func() ([]int, error) { reaps++; return nil, errors.New("test") })
			if code != 0 || reaps != tc.reaps {
				t.Errorf("exit %d after %d reaps, want 0 after %d", code, reaps, tc.reaps)
			}
		})
	}
}
