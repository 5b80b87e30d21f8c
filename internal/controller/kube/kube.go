// Package kube builds the controller's Kubernetes API clients and Event
// recorder.
package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
)

// Client returns a client from the kubeconfig file, or the pod's service
// account when kubeconfig is empty; userAgent names the role.
func Client(kubeconfig, userAgent string) (kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig, userAgent)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil
}

// Dynamic returns a dynamic client (for the snapshot CRDs), built as Client.
func Dynamic(kubeconfig, userAgent string) (dynamic.Interface, error) {
	cfg, err := restConfig(kubeconfig, userAgent)
	if err != nil {
		return nil, err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	return dc, nil
}

func restConfig(kubeconfig, userAgent string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no Kubernetes API access: not in a pod (%w) and --kubeconfig is empty", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = userAgent
	return cfg, nil
}

// Recorder returns an Event recorder writing through cs as component (on
// host, when set), and the function that stops it.
func Recorder(ctx context.Context, cs kubernetes.Interface, component, host string) (record.EventRecorder, func()) {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component, Host: host}), b.Shutdown
}
