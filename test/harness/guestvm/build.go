package guestvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

var tagRE = regexp.MustCompile(`^[A-Za-z0-9_.]+$`)

// BuildTestBinary compiles the tests of pkg (an import path, or a ./ path
// relative to the caller's directory) into the executable out with
// `go test -c`, on the host: CPU-bound Go runs about 28 times slower in the
// TCG guest. CGO_ENABLED=0 makes it static, so it runs in the guest whatever
// the guest's libraries.
func BuildTestBinary(ctx context.Context, pkg string, tags []string, out string) error {
	return goBuild(ctx, "test", []string{"-c"}, pkg, tags, out)
}

// BuildBinary compiles the main package pkg into out with `go build`
// (static, CGO_ENABLED=0), e.g. the carve binary for a guest run.
func BuildBinary(ctx context.Context, pkg string, tags []string, out string) error {
	return goBuild(ctx, "build", nil, pkg, tags, out)
}

func goBuild(ctx context.Context, sub string, flags []string, pkg string, tags []string, out string) error {
	if pkg == "" || strings.HasPrefix(pkg, "-") || out == "" || strings.HasPrefix(out, "-") {
		return fmt.Errorf("guestvm: go %s: bad package %q or output %q", sub, pkg, out)
	}
	for _, t := range tags {
		if !tagRE.MatchString(t) {
			return fmt.Errorf("guestvm: go %s: bad build tag %q", sub, t)
		}
	}
	gobin, err := goTool()
	if err != nil {
		return err
	}
	args := append([]string{sub}, flags...)
	args = append(args, "-o", out)
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("guestvm: go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// goTool finds the go command: in PATH (go test puts its own GOROOT/bin
// first there), else in $GOROOT/bin when GOROOT is set.
func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	root := os.Getenv("GOROOT")
	if root == "" {
		return "", errors.New("guestvm: the go command is not in PATH and GOROOT is not set")
	}
	p := filepath.Join(root, "bin", "go")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("guestvm: the go command is not in PATH nor in GOROOT: %w", err)
	}
	return p, nil
}
