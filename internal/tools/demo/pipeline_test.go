package demo

import (
	"context"
	"testing"

	"github.com/toolsvc/toolsvc/toolkit"
)

func TestPipeline(t *testing.T) {
	p := NewPipeline()
	if _, ok := any(p).(toolkit.Previewer); ok {
		t.Fatal("pipeline must not preview: the PREVIEW gate escalates it to CONFIRM")
	}

	r := succeed(t, p, "build", `{"ref":"main"}`)
	if got := valueAs[BuildResult](t, r.Value); got.Artifact != "main-build-1" {
		t.Fatalf("build = %+v", got)
	}
	r = succeed(t, p, "build", `{"ref":"v1.2.0"}`)
	if got := valueAs[BuildResult](t, r.Value); got.Artifact != "v1.2.0-build-2" {
		t.Fatalf("second build = %+v", got)
	}
	r = succeed(t, p, "test", `{"ref":"main"}`)
	if got := valueAs[TestResult](t, r.Value); !got.Passed {
		t.Fatalf("test = %+v", got)
	}
	r = succeed(t, p, "deploy", `{"environment":"production","ref":"main"}`)
	if got := valueAs[DeployResult](t, r.Value); got != (DeployResult{Deployed: true, Environment: "production", Ref: "main"}) {
		t.Fatalf("deploy = %+v", got)
	}
	if r.Message != "deployed main to production" {
		t.Fatalf("deploy message %q", r.Message)
	}

	fail(t, p, "deploy", `{"environment":"moon","ref":"main"}`, `unknown environment "moon"`)
	fail(t, p, "build", `{"ref":""}`, `invalid ref ""`)
	fail(t, p, "build", `{"ref":"a b"}`, "invalid ref")
	fail(t, p, "test", `{"ref":[1]}`, "invalid arguments")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r, err := p.Execute(ctx, newCall("pipeline", "deploy", `{"environment":"staging","ref":"main"}`)); err == nil {
		t.Fatalf("deploy after the deadline = %+v, want an error", r)
	}
}

func TestPipelineConcurrentBuildsGetDistinctArtifacts(t *testing.T) {
	p := NewPipeline()
	const n = 40
	got := make(chan string, n)
	for range n {
		go func() {
			r, err := p.Execute(context.Background(), newCall("pipeline", "build", `{"ref":"main"}`))
			if err != nil || !r.Success {
				got <- ""
				return
			}
			got <- r.Value.(BuildResult).Artifact
		}()
	}
	seen := map[string]bool{}
	for range n {
		a := <-got
		if a == "" || seen[a] {
			t.Fatalf("artifact %q empty or repeated", a)
		}
		seen[a] = true
	}
}
