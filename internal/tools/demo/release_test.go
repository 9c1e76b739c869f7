package demo

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/toolsvc/toolsvc/toolkit"
)

// stepsRunner stands in for toolsvc's runtime: it runs the release's steps
// on a pipeline, or answers them as the test scripts.
type stepsRunner struct {
	pipeline *Pipeline
	steps    []toolkit.Step
	// answer, if set, answers a step instead of running it.
	answer func(toolkit.Step) (*toolkit.StepResult, error)
}

func (r *stepsRunner) invoke(ctx context.Context, s toolkit.Step) (*toolkit.StepResult, error) {
	r.steps = append(r.steps, s)
	if r.answer != nil {
		if res, err := r.answer(s); res != nil || err != nil {
			return res, err
		}
	}
	args, err := json.Marshal(s.Arguments)
	if err != nil {
		return nil, err
	}
	res, err := r.pipeline.Execute(ctx, &toolkit.Call{Tool: s.Tool, Action: s.Action, Arguments: args})
	if err != nil {
		return nil, err
	}
	v, _ := json.Marshal(res.Value)
	out := &toolkit.StepResult{CallID: "call-" + s.ID, Outcome: toolkit.StepSucceeded, Success: res.Success, Message: res.Message, Value: v}
	if !res.Success {
		out.Outcome = toolkit.StepFailed
	}
	return out, nil
}

func releaseCall(r *stepsRunner, progress *[]string) *toolkit.Call {
	return &toolkit.Call{
		Tool: "release", Action: "run", Arguments: toolkit.JSON(`{"version":"v1.2.0"}`),
		OnInvoke: r.invoke,
		OnProgress: func(_ context.Context, m string) error {
			*progress = append(*progress, m)
			return nil
		},
	}
}

func TestRelease(t *testing.T) {
	ctx := context.Background()
	t.Run("all steps succeed", func(t *testing.T) {
		r := &stepsRunner{pipeline: NewPipeline()}
		var progress []string
		res, err := NewRelease().Execute(ctx, releaseCall(r, &progress))
		if err != nil || !res.Success || res.Message != "released v1.2.0: built v1.2.0-build-1, tests passed, deployed to production" {
			t.Fatalf("release: %+v %v", res, err)
		}
		var got []string
		for _, s := range r.steps {
			got = append(got, s.ID+"="+s.Tool+"."+s.Action)
		}
		if strings.Join(got, " ") != "build=pipeline.build test=pipeline.test deploy=pipeline.deploy" {
			t.Fatalf("steps %v", got)
		}
		if d := r.steps[2].Arguments.(map[string]string); d["environment"] != "production" || d["ref"] != "v1.2.0" {
			t.Fatalf("deploy arguments %v", d)
		}
		if len(progress) != 3 || progress[2] != "step 3 of 3: deploy v1.2.0" {
			t.Fatalf("progress %q", progress)
		}
		v := res.Value.(ReleaseResult)
		if v.Artifact != "v1.2.0-build-1" || len(v.Steps) != 3 || v.Steps[2].CallID != "call-deploy" {
			t.Fatalf("value %+v", v)
		}
	})
	t.Run("a step fails", func(t *testing.T) {
		r := &stepsRunner{pipeline: NewPipeline(), answer: func(s toolkit.Step) (*toolkit.StepResult, error) {
			if s.ID == "test" {
				return &toolkit.StepResult{CallID: "c", Outcome: toolkit.StepFailed, Message: "2 tests failed"}, nil
			}
			return nil, nil
		}}
		var progress []string
		res, err := NewRelease().Execute(ctx, releaseCall(r, &progress))
		if err != nil || res.Success || res.Message != "release v1.2.0 stopped at test (FAILED): 2 tests failed" || len(r.steps) != 2 {
			t.Fatalf("release: %+v %v, steps %d", res, err, len(r.steps))
		}
	})
	t.Run("a step parks, or its outcome is unknown", func(t *testing.T) {
		for _, want := range []error{
			&toolkit.ParkedError{Step: "deploy", CallID: "c", ApprovalID: "a"},
			toolkit.OutcomeUnknown(errors.New("lost")),
		} {
			r := &stepsRunner{pipeline: NewPipeline(), answer: func(s toolkit.Step) (*toolkit.StepResult, error) {
				if s.ID == "deploy" {
					return nil, want
				}
				return nil, nil
			}}
			var progress []string
			res, err := NewRelease().Execute(ctx, releaseCall(r, &progress))
			if res != nil || !errors.Is(err, want) {
				t.Fatalf("release: %+v %v, want the step's error %v", res, err, want)
			}
		}
	})
	t.Run("without a runtime", func(t *testing.T) {
		res, err := NewRelease().Execute(ctx, &toolkit.Call{Tool: "release", Action: "run", Arguments: toolkit.JSON(`{"version":"v1"}`)})
		if res != nil || !errors.Is(err, toolkit.ErrNoRuntime) {
			t.Fatalf("release without a runtime: %+v %v", res, err)
		}
	})
}
