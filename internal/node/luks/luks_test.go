package luks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	utilexec "k8s.io/utils/exec"
	fakeexec "k8s.io/utils/exec/testing"
)

// oneRun is an exec that runs one command: it records its argv and
// stdin and answers with out and the exit code.
func oneRun(out string, code int, argv *[]string, stdin *[]byte) *fakeexec.FakeExec {
	cmd := &fakeexec.FakeCmd{}
	cmd.CombinedOutputScript = []fakeexec.FakeAction{func() ([]byte, []byte, error) {
		if cmd.Stdin != nil {
			*stdin, _ = io.ReadAll(cmd.Stdin)
		}
		if code != 0 {
			return []byte(out), nil, &fakeexec.FakeExitError{Status: code}
		}
		return []byte(out), nil, nil
	}}
	return &fakeexec.FakeExec{CommandScript: []fakeexec.FakeCommandAction{func(name string, args ...string) utilexec.Cmd {
		*argv = append([]string{name}, args...)
		return fakeexec.InitFakeCmd(cmd, name, args...)
	}}}
}

// TestKeysGoOnStdin: a key is never in cryptsetup's argv, only on its
// standard input.
func TestKeysGoOnStdin(t *testing.T) {
	key := bytes.Repeat([]byte{0xAB}, 32)
	var argv []string
	var stdin []byte
	c := Cryptsetup{Exec: oneRun("", 0, &argv, &stdin)}
	if err := c.Open(context.Background(), "/dev/vg/lv", "carve-luks-x", key); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(argv, []string{"cryptsetup", "open", "--type", "luks2", "--key-file", "-", "/dev/vg/lv", "carve-luks-x"}) {
		t.Errorf("argv %q", argv)
	}
	if !bytes.Equal(stdin, key) {
		t.Errorf("stdin %x", stdin)
	}
	if strings.Contains(strings.Join(argv, " "), string(key)) {
		t.Error("the key is in argv")
	}
}

func TestExitCodes(t *testing.T) {
	var argv []string
	var stdin []byte
	ctx := context.Background()
	if err := (Cryptsetup{Exec: oneRun("No key available with this passphrase.", 2, &argv, &stdin)}).Open(ctx, "/dev/vg/lv", "n", []byte("k")); !errors.Is(err, ErrWrongKey) {
		t.Errorf("exit 2 of open = %v, want ErrWrongKey", err)
	}
	if err := (Cryptsetup{Exec: oneRun("Device n is not active.", 4, &argv, &stdin)}).Close(ctx, "n"); err != nil {
		t.Errorf("close of a device not open = %v", err)
	}
	if ok, err := (Cryptsetup{Exec: oneRun("", 1, &argv, &stdin)}).IsLUKS(ctx, "/dev/vg/lv"); ok || err != nil {
		t.Errorf("isLuks exit 1 = %v, %v", ok, err)
	}
	if ok, err := (Cryptsetup{Exec: oneRun("", 0, &argv, &stdin)}).IsLUKS(ctx, "/dev/vg/lv"); !ok || err != nil {
		t.Errorf("isLuks exit 0 = %v, %v", ok, err)
	}
	if _, err := (Cryptsetup{Exec: oneRun("Token 0 is not in use.", 1, &argv, &stdin)}).ReadToken(ctx, "/dev/vg/lv"); !errors.Is(err, ErrNoToken) {
		t.Errorf("token export exit 1 = %v, want ErrNoToken", err)
	}
}

func TestParseToken(t *testing.T) {
	tok, err := ParseToken([]byte(`{"type":"carve-volume-key","keyslots":["0"],"carve_key_id":"abc","carve_wrapped_key":"carve1.1.xyz"}`))
	if err != nil || tok != (Token{KeyID: "abc", Wrapped: "carve1.1.xyz"}) {
		t.Errorf("ParseToken = %+v, %v", tok, err)
	}
	for _, bad := range []string{`{"type":"systemd-tpm2","keyslots":["0"]}`, `{"type":"carve-volume-key"}`, `nonsense`} {
		if _, err := ParseToken([]byte(bad)); err == nil {
			t.Errorf("ParseToken(%s) accepted", bad)
		}
	}
}
