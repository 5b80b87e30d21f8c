package peercopy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/node/provision"
	"github.com/carve-csi/carve/internal/nodeca"
	"github.com/carve-csi/carve/internal/nodeca/nodecatest"
)

// fileReader serves sources from files: id -> path.
type fileReader map[string]string

func (f fileReader) SourceSize(_ context.Context, id string, _ bool) (uint64, error) {
	p, ok := f[id]
	if !ok {
		return 0, provision.Errorf(provision.ErrNotFound, "%s does not exist", id)
	}
	st, err := os.Stat(p)
	if err != nil {
		return 0, err
	}
	return uint64(st.Size()), nil
}

func (f fileReader) ReadSource(ctx context.Context, id string, snapshot bool, _ string, read func(string, uint64) error) error {
	size, err := f.SourceSize(ctx, id, snapshot)
	if err != nil {
		return err
	}
	return read(f[id], size)
}

// copyEnv is a source node-a serving NodeCopy over TLS, and the
// certificates of nodes b and c.
type copyEnv struct {
	srv    *Server
	addr   string
	trust  *nodeca.Pool
	iss    *nodeca.Issuer
	data   []byte
	now    time.Time
	source string
}

func newCopyEnv(t *testing.T) *copyEnv {
	t.Helper()
	path, data := source(t, 6<<20+SparseChunk)
	return newCopyEnvOf(t, path, data)
}

// newCopyEnvOf is newCopyEnv serving the file path (holding data, nil
// when not needed).
func newCopyEnvOf(t testing.TB, path string, data []byte) *copyEnv {
	t.Helper()
	ca, iss := nodecatest.NewIssuer(t)
	e := &copyEnv{trust: nodeca.NewPool(ca.Cert), iss: iss, now: time.Now(), source: "node-a/vg/snap", data: data}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	_, p, _ := net.SplitHostPort(e.addr)
	port, _ := strconv.Atoi(p)
	e.srv = NewServer(ServerConfig{NodeName: "node-a", Reader: fileReader{e.source: path}, Port: port, Now: func() time.Time { return e.now }})
	tlsCfg, err := nodeca.CopyServerConfig(nodeca.Peer{Cert: nodeca.NewKeypair(e.cert(t, "node-a")), CAs: e.trust})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
	nodeagentv1.RegisterNodeCopyServer(g, e.srv)
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return e
}

func (e *copyEnv) cert(t testing.TB, node string) *tls.Certificate {
	t.Helper()
	c, err := e.iss.IssueNode(node)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *copyEnv) grant(t testing.TB, id, target string) {
	t.Helper()
	resp, err := e.srv.Authorize(t.Context(), &nodeagentv1.AuthorizeCopyRequest{CopyId: id, SnapshotId: e.source,
		TargetNode: target, TargetVolumeName: "pvc-" + id, ValidSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if e.data != nil && resp.GetSizeBytes() != int64(len(e.data)) || resp.GetCopyPort() == 0 {
		t.Fatalf("AuthorizeCopy: %v", resp)
	}
}

// pull reads copy id as node into a new file and returns what it holds.
func (e *copyEnv) pull(t *testing.T, node, id string) ([]byte, error) {
	t.Helper()
	dst := writeFile(t, "dst", bytes.Repeat([]byte{0xee}, len(e.data)))
	p := Puller{Cert: nodeca.NewKeypair(e.cert(t, node)), CAs: e.trust}
	_, err := p.Pull(t.Context(), provision.RemoteSource{CopyID: id, ID: e.source, Snapshot: true, Node: "node-a",
		Address: e.addr, Size: uint64(len(e.data))}, dst, false, nil)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(dst)
}

// TestReadVolume: the granted node reads the source once, whole; another
// node, an unknown copy, a second read and an expired grant are refused.
func TestReadVolume(t *testing.T) {
	e := newCopyEnv(t)
	e.grant(t, "c1", "node-b")
	if _, err := e.pull(t, "node-c", "c1"); status.Code(errorsCause(err)) != codes.PermissionDenied {
		t.Errorf("node-c reading node-b's copy: %v, want PERMISSION_DENIED", err)
	}
	got, err := e.pull(t, "node-b", "c1")
	if err != nil {
		t.Fatalf("node-b reading its copy: %v", err)
	}
	if !bytes.Equal(got, e.data) {
		t.Error("node-b's copy differs from the source")
	}
	if _, err := e.pull(t, "node-b", "c1"); status.Code(errorsCause(err)) != codes.PermissionDenied {
		t.Errorf("a second read: %v, want PERMISSION_DENIED", err)
	}
	if _, err := e.pull(t, "node-b", "never-granted"); status.Code(errorsCause(err)) != codes.PermissionDenied {
		t.Errorf("an unknown copy: %v, want PERMISSION_DENIED", err)
	}
	e.grant(t, "c2", "node-b")
	e.now = e.now.Add(2 * time.Minute)
	if _, err := e.pull(t, "node-b", "c2"); status.Code(errorsCause(err)) != codes.PermissionDenied {
		t.Errorf("an expired grant: %v, want PERMISSION_DENIED", err)
	}
}

// TestPullVerifiesSource: the target refuses a server that is not the
// source node named in its ticket.
func TestPullVerifiesSource(t *testing.T) {
	e := newCopyEnv(t)
	e.grant(t, "c1", "node-b")
	dst := writeFile(t, "dst", make([]byte, len(e.data)))
	p := Puller{Cert: nodeca.NewKeypair(e.cert(t, "node-b")), CAs: e.trust}
	_, err := p.Pull(t.Context(), provision.RemoteSource{CopyID: "c1", ID: e.source, Snapshot: true, Node: "node-z",
		Address: e.addr, Size: uint64(len(e.data))}, dst, false, nil)
	if status.Code(errorsCause(err)) != codes.Unavailable {
		t.Errorf("Pull from node-a as node-z: %v, want UNAVAILABLE (handshake refused)", err)
	}
}

// TestAuthorize: what AuthorizeCopy refuses.
func TestAuthorize(t *testing.T) {
	e := newCopyEnv(t)
	tests := []struct {
		name string
		req  *nodeagentv1.AuthorizeCopyRequest
		want codes.Code
	}{
		{"no copy ID", &nodeagentv1.AuthorizeCopyRequest{SnapshotId: e.source, TargetNode: "node-b", TargetVolumeName: "v"}, codes.InvalidArgument},
		{"both sources", &nodeagentv1.AuthorizeCopyRequest{CopyId: "x", SnapshotId: e.source, VolumeId: "vg/v", TargetNode: "node-b", TargetVolumeName: "v"}, codes.InvalidArgument},
		{"the source's own node", &nodeagentv1.AuthorizeCopyRequest{CopyId: "x", SnapshotId: e.source, TargetNode: "node-a", TargetVolumeName: "v"}, codes.InvalidArgument},
		{"a bad node name", &nodeagentv1.AuthorizeCopyRequest{CopyId: "x", SnapshotId: e.source, TargetNode: "Node_B", TargetVolumeName: "v"}, codes.InvalidArgument},
		{"a missing source", &nodeagentv1.AuthorizeCopyRequest{CopyId: "x", SnapshotId: "node-a/vg/gone", TargetNode: "node-b", TargetVolumeName: "v"}, codes.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := e.srv.Authorize(t.Context(), tt.req); status.Code(err) != tt.want {
				t.Errorf("Authorize: %v, want %s", err, tt.want)
			}
		})
	}
}

// errorsCause is the gRPC status an error wraps.
func errorsCause(err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if _, ok := status.FromError(e); ok {
			return e
		}
	}
	return err
}
