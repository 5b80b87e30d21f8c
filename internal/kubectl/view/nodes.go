package view

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The labels that find carve's node agents.
const (
	agentSelector       = "app.kubernetes.io/name=carve,app.kubernetes.io/component=node"
	defaultAgentService = "carve-node"
	nodeGroupLabel      = "carve.dev/node-group"
	noNodeGroup         = "none" // the node group that keeps carve off a node
	agentContainer      = "carve"
	versionLabel        = "app.kubernetes.io/version"
	reasonUnhealthy     = "Unhealthy"
	agentReady          = "Ready"
	channelReady        = "Ready"
	channelNotReady     = "NotReady"
	channelNoAddress    = "None"
)

// Node is one node's carve agent as the API sees it.
type Node struct {
	Node string `json:"node"`
	// Group is the node's carve.dev/node-group label ("" for none).
	Group string `json:"group,omitempty"`
	// Pod is the agent's pod (namespace/name), "" when none runs there.
	Pod string `json:"pod,omitempty"`
	// Agent is Ready, NotReady, or NoPod; Reason says why it is not ready.
	Agent  string `json:"agent"`
	Reason string `json:"reason,omitempty"`
	// Channel is the agent's EndpointSlice state (Ready, NotReady, None).
	Channel string `json:"channel"`
	// Registered: the kubelet lists carve's driver in the node's CSINode.
	Registered bool `json:"registered"`
	// Version is the agent's image tag (or its version label).
	Version string `json:"version,omitempty"`
	// Free is the capacity the node publishes per device class, in bytes.
	Free map[string]int64 `json:"free,omitempty"`
	// Created is when the agent's pod was made (kubectl's AGE of a pod).
	Created time.Time `json:"created,omitzero"`
}

// Nodes lists every node (but node group "none") with its carve agent's state.
func (v View) Nodes(ctx context.Context) ([]Node, error) {
	nodes, err := v.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	pods, err := v.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: agentSelector})
	if err != nil {
		return nil, fmt.Errorf("listing carve's node pods: %w", err)
	}
	channel, err := v.channels(ctx)
	if err != nil {
		return nil, err
	}
	csiNodes, err := v.Client.StorageV1().CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing CSINodes: %w", err)
	}
	caps, err := v.capacities(ctx, false)
	if err != nil {
		return nil, err
	}
	// The pods' namespace is carve's: its probe events are there.
	unhealthy := map[string]string{}
	if len(pods.Items) > 0 {
		events, err := v.Client.CoreV1().Events(onlyNamespace(pods.Items)).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Pod,reason=" + reasonUnhealthy})
		if err != nil {
			return nil, fmt.Errorf("listing the probe events of carve's node pods: %w", err)
		}
		unhealthy = lastProbeFailures(events.Items)
	}

	agents := agentsByNode(pods.Items)
	registered := map[string]bool{}
	for _, n := range csiNodes.Items {
		for _, d := range n.Spec.Drivers {
			if d.Name == v.Driver {
				registered[n.Name] = true
			}
		}
	}
	free := map[string]map[string]int64{}
	for _, c := range caps {
		if free[c.Node] == nil {
			free[c.Node] = map[string]int64{}
		}
		class := c.DeviceClass
		if class == "" {
			class = c.StorageClass
		}
		free[c.Node][class] = c.CapacityBytes
	}

	var out []Node
	for _, n := range nodes.Items {
		group := n.Labels[nodeGroupLabel]
		if group == noNodeGroup {
			continue
		}
		row := Node{Node: n.Name, Group: group, Agent: "NoPod", Channel: channelNoAddress, Registered: registered[n.Name],
			Free: free[n.Name]}
		if ch, ok := channel[n.Name]; ok {
			row.Channel = ch
		}
		if p := agents[n.Name]; p != nil {
			row.Pod = p.Namespace + "/" + p.Name
			row.Agent, row.Reason = podReadiness(p, unhealthy[p.Namespace+"/"+p.Name])
			row.Version = agentVersion(p)
			row.Created = p.CreationTimestamp.Time
		} else {
			row.Reason = "no carve node pod on this node"
		}
		out = append(out, row)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// agentsByNode maps each node to its agent pod (two during a rollout).
func agentsByNode(pods []corev1.Pod) map[string]*corev1.Pod {
	agents := map[string]*corev1.Pod{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" {
			continue
		}
		if cur := agents[p.Spec.NodeName]; cur == nil || preferAgent(p, cur) {
			agents[p.Spec.NodeName] = p
		}
	}
	return agents
}

// channels maps each node to its agent endpoint's state; Ready if any is.
func (v View) channels(ctx context.Context) (map[string]string, error) {
	service := v.AgentService
	if service == "" {
		service = defaultAgentService
	}
	slices, err := v.Client.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		return nil, fmt.Errorf("listing the EndpointSlices of Service %s: %w", service, err)
	}
	channel := map[string]string{}
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if ep.NodeName == nil {
				continue
			}
			state := channelNotReady
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				state = channelReady
			}
			if channel[*ep.NodeName] != channelReady {
				channel[*ep.NodeName] = state
			}
		}
	}
	return channel, nil
}

// preferAgent prefers the pod not terminating, else the newer.
func preferAgent(p, cur *corev1.Pod) bool {
	if pt, ct := p.DeletionTimestamp != nil, cur.DeletionTimestamp != nil; pt != ct {
		return !pt
	}
	return p.CreationTimestamp.After(cur.CreationTimestamp.Time)
}

func onlyNamespace(pods []corev1.Pod) string {
	ns := ""
	for _, p := range pods {
		if ns != "" && p.Namespace != ns {
			return ""
		}
		ns = p.Namespace
	}
	return ns
}

func lastProbeFailures(events []corev1.Event) map[string]string {
	last := map[string]*corev1.Event{}
	for i := range events {
		e := &events[i]
		if e.InvolvedObject.Kind != "Pod" || e.Reason != reasonUnhealthy {
			continue
		}
		k := e.InvolvedObject.Namespace + "/" + e.InvolvedObject.Name
		if cur := last[k]; cur == nil || !eventTime(e).Before(eventTime(cur)) {
			last[k] = e
		}
	}
	out := map[string]string{}
	for k, e := range last {
		out[k] = e.Message
	}
	return out
}

// podReadiness is Ready, or NotReady and the most telling reason.
func podReadiness(p *corev1.Pod, probe string) (string, string) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return agentReady, ""
		}
	}
	if p.DeletionTimestamp != nil {
		return "NotReady", "terminating"
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return "NotReady", strings.TrimSpace(w.Reason + " " + w.Message)
		}
		if t := cs.State.Terminated; t != nil {
			return "NotReady", fmt.Sprintf("%s (exit %d)", t.Reason, t.ExitCode)
		}
	}
	if p.Status.Phase != corev1.PodRunning {
		return "NotReady", "pod " + string(p.Status.Phase)
	}
	if probe != "" {
		return "NotReady", probe
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Message != "" {
			return "NotReady", c.Message
		}
	}
	return "NotReady", ""
}

// agentVersion is the agent container's image tag, else the version label.
func agentVersion(p *corev1.Pod) string {
	for _, c := range p.Spec.Containers {
		if c.Name != agentContainer {
			continue
		}
		image, _, _ := strings.Cut(c.Image, "@")
		if i := strings.LastIndex(image, ":"); i >= 0 && !strings.Contains(image[i:], "/") {
			return image[i+1:]
		}
	}
	return p.Labels[versionLabel]
}
