package kubetest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// childEnv marks the child process of TestFinale, in which the
// TestFinaleChild tests run; elsewhere they return at once.
const childEnv = "KUBETEST_FINALE_CHILD"

// childFinale is the finale of the child process, which starts it as a
// tier's TestMain does.
var childFinale = NewFinale("TestFinaleChildSecondToLast", "TestFinaleChildLast")

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(childEnv) != "" {
		if err := childFinale.makeRoom(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}

// The child's tests, declared in the opposite of the order they must run
// in.

func TestFinaleChildLast(t *testing.T) { childStep(t, true) }

func TestFinaleChildSecondToLast(t *testing.T) { childStep(t, true) }

func TestFinaleChildSerial(t *testing.T) { childStep(t, false) }

// childStep prints the test's name when it runs in the child, after
// entering the finale when inFinale.
func childStep(t *testing.T, inFinale bool) {
	if os.Getenv(childEnv) == "" {
		return
	}
	if inFinale {
		childFinale.Enter(t)
	}
	fmt.Println("STEP", t.Name())
}

// TestFinale runs the child's tests in a child process with one parallel
// slot, the least a run can have: the finale's tests run after the serial
// one and in their order, with none waiting for a test that does not run.
func TestFinale(t *testing.T) {
	for _, tc := range []struct {
		run  string
		want []string
	}{
		{"^TestFinaleChild", []string{"TestFinaleChildSerial", "TestFinaleChildSecondToLast", "TestFinaleChildLast"}},
		{"^TestFinaleChild(Last|Serial)$", []string{"TestFinaleChildSerial", "TestFinaleChildLast"}},
		{"^TestFinaleChildLast$", []string{"TestFinaleChildLast"}},
	} {
		t.Run(tc.run, func(t *testing.T) {
			cmd := exec.CommandContext(Ctx(t, time.Minute), os.Args[0], "-test.run", tc.run, "-test.parallel", "1", "-test.count", "2")
			cmd.Env = append(os.Environ(), childEnv+"=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the child run failed: %v\n%s", err, out)
			}
			var got []string
			for _, m := range regexp.MustCompile(`(?m)^STEP (\S+)$`).FindAllStringSubmatch(string(out), -1) {
				got = append(got, m[1])
			}
			// -test.count 2: the order holds in each round.
			if want := slices.Concat(tc.want, tc.want); !slices.Equal(got, want) {
				t.Errorf("order %s, want %s", strings.Join(got, ", "), strings.Join(want, ", "))
			}
		})
	}
}
