// Package kubeclient builds the daemon's client of the Kubernetes API:
// core/v1 alone (pods, events), through a bare RESTClient.
package kubeclient

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// CoreV1 returns a client of the core/v1 API on the API server of cfg,
// which it adjusts.
//
// It is a bare RESTClient rather than the generated clientset: the
// clientset's scheme and typed clients import every API group, which
// doubled the binary and, as their package init touches it, the daemon's
// resident memory. The daemon needs core/v1 only.
func CoreV1(cfg *rest.Config) (*rest.RESTClient, error) {
	// core/v1 brings along the meta/v1 types a client decodes besides its
	// objects: watch events and the Status of a refused request.
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	cfg.APIPath = "/api"
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	// Pods are the API's bulkiest objects; protobuf decodes them with far
	// less garbage than JSON. The codec factory serves it for any scheme.
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	return rest.RESTClientFor(cfg)
}
