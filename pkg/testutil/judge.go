package testutil

import (
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Observer is a detector as the pipeline runs it on each process.
type Observer interface {
	Observe(now time.Time, p *model.Process) []model.Finding
}

// Judge does for one view what a poll of the pipeline does: fill fills
// procs (a concern's Fill), each of dets judges the processes filled, in
// turn, and annotate, if set, adds to each finding what the view's source
// says (the fd view's Annotate). The tests of a view use it to see their
// view's findings without the pipeline.
func Judge(now time.Time, procs []*model.Process, fill func(time.Time, []*model.Process) ([]*model.Process, error),
	annotate func(*model.Process, *model.Finding), dets ...Observer) ([]model.Finding, error) {
	filled, err := fill(now, procs)
	if err != nil {
		return nil, err
	}
	var out []model.Finding
	for _, d := range dets {
		for _, p := range filled {
			for _, f := range d.Observe(now, p) {
				if annotate != nil {
					annotate(p, &f)
				}
				out = append(out, f)
			}
		}
	}
	return out, nil
}
