package volumekey

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestStoreCreatesAndRotates(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	s := NewStore(client, "carve-system", DefaultSecret)
	r, err := s.Keyring(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Newest() != "1" {
		t.Fatalf("first KEK %s", r.Newest())
	}
	sec, err := client.CoreV1().Secrets("carve-system").Get(ctx, DefaultSecret, metav1.GetOptions{})
	if err != nil || len(sec.Data["kek-1"]) != KeySize {
		t.Fatalf("Secret: %v, %v", sec, err)
	}
	key, _ := NewKey()
	id := KeyIDFor("pvc-a")
	w1, _ := r.Wrap(id, key)

	// Another replica reads the same KEK.
	other := NewStore(client, "carve-system", DefaultSecret)
	r2, err := other.Keyring(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Unwrap(id, w1); err != nil {
		t.Fatalf("another replica: %v", err)
	}
	// Rotation adds KEK 2 and keeps KEK 1: old keys still unwrap.
	newID, err := s.Rotate(ctx)
	if err != nil || newID != "2" {
		t.Fatalf("Rotate = %s, %v", newID, err)
	}
	r, _ = s.Keyring(ctx)
	if r.Newest() != "2" || !r.Has("1") {
		t.Fatalf("after rotation: %v", r.IDs())
	}
	if _, err := r.Unwrap(id, w1); err != nil {
		t.Errorf("a key under KEK 1 after rotation: %v", err)
	}
	// The other replica learns KEK 2 on reload.
	if r2, _ = other.Reload(ctx); !r2.Has("2") {
		t.Error("reload missed KEK 2")
	}
}

// TestRotationByAnnotation: the annotation on the Secret has the next
// read add a KEK and take the annotation off.
func TestRotationByAnnotation(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	s := NewStore(client, "carve-system", DefaultSecret)
	if _, err := s.Keyring(ctx); err != nil {
		t.Fatal(err)
	}
	sec, _ := client.CoreV1().Secrets("carve-system").Get(ctx, DefaultSecret, metav1.GetOptions{})
	sec.Annotations = map[string]string{RotateAnnotation: "requested"}
	if _, err := client.CoreV1().Secrets("carve-system").Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Reload(ctx)
	if err != nil || r.Newest() != "2" || !r.Has("1") {
		t.Fatalf("after the annotation: %v, %v", r.IDs(), err)
	}
	sec, _ = client.CoreV1().Secrets("carve-system").Get(ctx, DefaultSecret, metav1.GetOptions{})
	if _, ok := sec.Annotations[RotateAnnotation]; ok || len(sec.Data) != 2 {
		t.Errorf("Secret after the rotation: annotations %v, %d keys", sec.Annotations, len(sec.Data))
	}
	// Read again: no second rotation.
	if r, _ = s.Reload(ctx); r.Newest() != "2" {
		t.Errorf("rotated again: %v", r.IDs())
	}
}
