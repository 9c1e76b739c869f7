package demo

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/toolsvc/toolsvc/toolkit"
)

// versionPattern is the schema's pattern for a release version.
var versionPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,40}$`)

// Release releases a version: it runs pipeline build, test and deploy as
// steps of its own call, each through the whole pipeline (docs/native-tools.md).
// It is LOW risk itself; its steps are judged on their own: at SUPERVISED
// build and test run unattended and deploy (CRITICAL) waits for an
// approval, which parks the release behind it. The release's retry, once
// the deploy is approved, replays build and test and runs the deploy once.
type Release struct{}

// NewRelease returns the release tool.
func NewRelease() *Release { return &Release{} }

// Definition describes the release tool.
func (*Release) Definition() toolkit.Definition {
	return toolkit.Definition{
		Name:           "release",
		Description:    "Release a version: build it, test it and deploy it to production with the pipeline tool, each as a step of its own.",
		Capabilities:   []string{"demo", "ci"},
		RequiredScopes: []string{"pipeline"},
		DefaultRisk:    toolkit.RiskLow,
		Timeout:        time.Minute,
		AuditPayloads:  true,
		Actions: []toolkit.Action{{
			Name:        "run",
			Description: "Build, test and deploy a version. Stops at the first step that fails; waits (parked) while a step waits for a person.",
			InputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {"version": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,40}$", "description": "The version to release, such as v1.2.0 (a git ref)."}},
				"required": ["version"]
			}`),
			OutputSchema: toolkit.JSON(`{
				"type": "object",
				"properties": {
					"version": {"type": "string"},
					"artifact": {"type": "string"},
					"steps": {"type": "array", "items": {"type": "object"}}
				},
				"required": ["version", "artifact", "steps"]
			}`),
			Examples: []toolkit.Example{{Description: "Release v1.2.0.", Input: toolkit.JSON(`{"version": "v1.2.0"}`)}},
		}},
	}
}

// ReleaseStep is one step of a release as its result reports it.
type ReleaseStep struct {
	Step     string `json:"step"`
	CallID   string `json:"call_id"`
	Replayed bool   `json:"replayed"`
	Message  string `json:"message"`
}

// ReleaseResult is the value of release.run.
type ReleaseResult struct {
	Version  string        `json:"version"`
	Artifact string        `json:"artifact"`
	Steps    []ReleaseStep `json:"steps"`
}

// Execute runs the release's steps in order.
func (*Release) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var args struct {
		Version string `json:"version"`
	}
	if r := bind(call, &args); r != nil {
		return r, nil
	}
	if !versionPattern.MatchString(args.Version) {
		return toolkit.Failure(fmt.Sprintf("invalid version %q", args.Version)), nil
	}
	out := ReleaseResult{Version: args.Version}
	for _, s := range []struct {
		action string
		args   map[string]string
	}{
		{"build", map[string]string{"ref": args.Version}},
		{"test", map[string]string{"ref": args.Version}},
		{"deploy", map[string]string{"ref": args.Version, "environment": "production"}},
	} {
		if err := call.Progress(ctx, fmt.Sprintf("step %d of 3: %s %s", len(out.Steps)+1, s.action, args.Version)); err != nil {
			return nil, err
		}
		res, err := call.Invoke(ctx, toolkit.Step{ID: s.action, Tool: "pipeline", Action: s.action, Arguments: s.args})
		if err != nil {
			// Parked (the call waits with it), unknown (so is the
			// release), or refused: toolsvc records the release so.
			return nil, err
		}
		out.Steps = append(out.Steps, ReleaseStep{Step: s.action, CallID: res.CallID, Replayed: res.Replayed, Message: res.Message})
		if !res.Success {
			return &toolkit.Result{Success: false, Value: out,
				Message: fmt.Sprintf("release %s stopped at %s (%s): %s", args.Version, s.action, res.Outcome, res.Message)}, nil
		}
		if s.action == "build" {
			var b BuildResult
			if err := res.Bind(&b); err != nil {
				return nil, err
			}
			out.Artifact = b.Artifact
		}
	}
	return toolkit.OK(out, fmt.Sprintf("released %s: built %s, tests passed, deployed to production", args.Version, out.Artifact)), nil
}
