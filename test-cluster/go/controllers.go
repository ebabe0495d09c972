package main

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	namespacecontroller "k8s.io/kubernetes/pkg/controller/namespace"
)

// startNamespaceController runs kube-controller-manager's namespace
// controller against the API server, so deleting a namespace deletes what
// is in it and then the namespace, as on a real cluster. Without it a
// deleted namespace would stay Terminating for ever. No other controller
// runs (no garbage collector, no service accounts): what the tests rely on
// beyond the API server itself is this one.
func startNamespaceController(ctx context.Context, server string, c *credentials) error {
	config := &rest.Config{
		Host:            server,
		BearerToken:     c.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		QPS:             100,
		Burst:           200,
		UserAgent:       "test-cluster/namespace-controller",
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("namespace controller client: %w", err)
	}
	metadataClient, err := metadata.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("namespace controller metadata client: %w", err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	controller := namespacecontroller.NewNamespaceController(
		ctx,
		client,
		metadataClient,
		client.Discovery().ServerPreferredNamespacedResources,
		factory.Core().V1().Namespaces(),
		5*time.Minute,
		v1.FinalizerKubernetes,
	)
	factory.Start(ctx.Done())
	go controller.Run(ctx, 5)
	return nil
}
