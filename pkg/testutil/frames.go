package testutil

import "github.com/open-autoglm/autoglm-ebpf/pkg/model"

// Frames parses stack frames written as model.Frame.String writes them.
func Frames(texts ...string) []model.Frame {
	out := make([]model.Frame, len(texts))
	for i, s := range texts {
		out[i] = model.ParseFrame(s)
	}
	return out
}

// Texts writes frames as model.Frame.String does.
func Texts(frames []model.Frame) []string {
	out := make([]string, len(frames))
	for i, f := range frames {
		out[i] = f.String()
	}
	return out
}
