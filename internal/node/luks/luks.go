// Package luks runs cryptsetup for carve's encrypted volumes: a LUKS2 header
// with one keyslot for the volume's key and a token holding that key wrapped
// by carve controller; open, resize, close and crypto-erase. A key reaches
// cryptsetup on stdin only, never in an argument or a file.
package luks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	utilexec "k8s.io/utils/exec"
)

var (
	// ErrWrongKey: the key opens no keyslot of the header.
	ErrWrongKey = errors.New("the key opens no keyslot of the LUKS2 header")
	// ErrNoToken: the header holds no carve token (its wrapped key).
	ErrNoToken = errors.New("the LUKS2 header holds no carve token")
)

// TokenType is the type of carve's LUKS2 token.
const TokenType = "carve-volume-key"

// HeaderBytes is LUKS2's header at cryptsetup's defaults: the data start,
// which a crypto-erase wipes besides the keyslots.
const HeaderBytes = 16 << 20

// Token is carve's token: the key ID and the controller-wrapped key.
type Token struct {
	KeyID   string
	Wrapped string
}

// token is the JSON of carve's token (cryptsetup needs type and keyslots).
type token struct {
	Type     string   `json:"type"`
	Keyslots []string `json:"keyslots"`
	KeyID    string   `json:"carve_key_id"`
	Wrapped  string   `json:"carve_wrapped_key"`
}

// Interface is what carve asks of cryptsetup; Cryptsetup implements it.
type Interface interface {
	IsLUKS(ctx context.Context, device string) (bool, error)
	// Format writes a new LUKS2 header with one keyslot for key and token t,
	// destroying the device's data.
	Format(ctx context.Context, device string, key []byte, t Token) error
	// ReadToken reads carve's token; ErrNoToken when there is none.
	ReadToken(ctx context.Context, device string) (Token, error)
	ReplaceToken(ctx context.Context, device string, t Token) error
	// Open opens device as /dev/mapper/<name>; ErrWrongKey.
	Open(ctx context.Context, device, name string, key []byte) error
	// Close closes /dev/mapper/<name>; one that is not open is success.
	Close(ctx context.Context, name string) error
	// Resize grows the opened device to its LV; LUKS2 asks for key when the
	// kernel keyring lacks the volume key.
	Resize(ctx context.Context, name string, key []byte) error
	// Erase destroys every keyslot (luksErase): the data can never be decrypted
	// again.
	Erase(ctx context.Context, device string) error
}

// Cryptsetup runs the cryptsetup program from $PATH.
type Cryptsetup struct {
	Exec utilexec.Interface
}

var _ Interface = Cryptsetup{}

const (
	exitWrongParams = 1
	exitNoPerm      = 2 // a wrong passphrase or key
	exitWrongDevice = 4
)

// formatArgs: a volume key is 256 random bits, so a slow KDF adds nothing
// against guessing and would cost seconds and (argon2) a gigabyte per open.
var formatArgs = []string{"luksFormat", "--type", "luks2", "--batch-mode",
	"--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--key-file", "-"}

// run runs cryptsetup with stdin; an exit error carries its code.
func (c Cryptsetup) run(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := c.Exec.CommandContext(ctx, "cryptsetup", args...)
	// DM_DEV_DIR and DM_DISABLE_UDEV pass on to libdevmapper, as for lvm.
	cmd.SetEnv(append(os.Environ(), "LC_ALL=C"))
	cmd.SetStdin(bytes.NewReader(stdin))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, &Error{Args: args, Output: strings.TrimSpace(string(out)), Err: err}
	}
	return out, nil
}

// Error is a failed cryptsetup run: arguments (never a key) and output.
type Error struct {
	Args   []string
	Output string
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("cryptsetup %s: %v: %s", strings.Join(e.Args, " "), e.Err, e.Output)
}

func (e *Error) Unwrap() error { return e.Err }

func exitCode(err error) int {
	var ee utilexec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitStatus()
	}
	return -1
}

// IsLUKS implements Interface.
func (c Cryptsetup) IsLUKS(ctx context.Context, device string) (bool, error) {
	_, err := c.run(ctx, nil, "isLuks", device)
	switch {
	case err == nil:
		return true, nil
	case exitCode(err) == exitWrongParams:
		return false, nil
	}
	return false, err
}

// Format implements Interface.
func (c Cryptsetup) Format(ctx context.Context, device string, key []byte, t Token) error {
	if _, err := c.run(ctx, key, append(formatArgs, device)...); err != nil {
		return err
	}
	return c.importToken(ctx, device, t, false)
}

func (c Cryptsetup) importToken(ctx context.Context, device string, t Token, replace bool) error {
	j, err := json.Marshal(token{Type: TokenType, Keyslots: []string{"0"}, KeyID: t.KeyID, Wrapped: t.Wrapped})
	if err != nil {
		return err
	}
	args := []string{"token", "import", "--json-file", "-", "--token-id", "0"}
	if replace {
		args = append(args, "--token-replace")
	}
	_, err = c.run(ctx, j, append(args, device)...)
	return err
}

// ReplaceToken implements Interface.
func (c Cryptsetup) ReplaceToken(ctx context.Context, device string, t Token) error {
	return c.importToken(ctx, device, t, true)
}

// ReadToken implements Interface.
func (c Cryptsetup) ReadToken(ctx context.Context, device string) (Token, error) {
	out, err := c.run(ctx, nil, "token", "export", "--token-id", "0", device)
	if err != nil {
		if exitCode(err) == exitWrongParams || exitCode(err) == exitWrongDevice {
			return Token{}, fmt.Errorf("%s: %w (%w)", device, ErrNoToken, err)
		}
		return Token{}, err
	}
	return ParseToken(out)
}

// ParseToken reads carve's token from its JSON.
func ParseToken(j []byte) (Token, error) {
	var t token
	if err := json.Unmarshal(j, &t); err != nil {
		return Token{}, fmt.Errorf("LUKS2 token: %w", err)
	}
	if t.Type != TokenType || t.KeyID == "" || t.Wrapped == "" {
		return Token{}, fmt.Errorf("LUKS2 token of type %q: %w", t.Type, ErrNoToken)
	}
	return Token{KeyID: t.KeyID, Wrapped: t.Wrapped}, nil
}

// Open implements Interface.
func (c Cryptsetup) Open(ctx context.Context, device, name string, key []byte) error {
	_, err := c.run(ctx, key, "open", "--type", "luks2", "--key-file", "-", device, name)
	if exitCode(err) == exitNoPerm {
		return fmt.Errorf("%s: %w", device, ErrWrongKey)
	}
	return err
}

// Close implements Interface.
func (c Cryptsetup) Close(ctx context.Context, name string) error {
	_, err := c.run(ctx, nil, "close", name)
	if exitCode(err) == exitWrongDevice {
		return nil // not open
	}
	return err
}

// Resize implements Interface.
func (c Cryptsetup) Resize(ctx context.Context, name string, key []byte) error {
	args := []string{"resize", "--batch-mode"}
	if key != nil {
		args = append(args, "--key-file", "-")
	}
	_, err := c.run(ctx, key, append(args, name)...)
	return err
}

// Erase implements Interface.
func (c Cryptsetup) Erase(ctx context.Context, device string) error {
	_, err := c.run(ctx, nil, "luksErase", "--batch-mode", device)
	return err
}

// MapperPath is name's opened device under devDir.
func MapperPath(devDir, name string) string { return filepath.Join(devDir, "mapper", name) }
