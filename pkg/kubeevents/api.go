package kubeevents

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// apiSink writes events with a core/v1 client (kubeclient.CoreV1) as
// client-go's typed client does (typed/core/v1's EventSinkImpl): that
// package would bring along every API group, 19 MB more binary.
type apiSink struct {
	client rest.Interface
}

func (a apiSink) Create(e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := a.client.Post().Namespace(e.Namespace).Resource("events").Body(e).Do(context.Background()).Into(out)
	return out, err
}

func (a apiSink) Update(e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := a.client.Put().Namespace(e.Namespace).Resource("events").Name(e.Name).Body(e).Do(context.Background()).Into(out)
	return out, err
}

// Patch applies the correlator's patch of a repeated event: its count and
// last time.
func (a apiSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := a.client.Patch(types.StrategicMergePatchType).Namespace(e.Namespace).Resource("events").Name(e.Name).
		Body(data).Do(context.Background()).Into(out)
	return out, err
}
