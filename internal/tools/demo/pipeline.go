package demo

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sync/atomic"

	"github.com/toolsvc/toolsvc/toolkit"
)

// refPattern is the schema's pattern for a git ref, checked again in the tool.
var refPattern = regexp.MustCompile(`^[A-Za-z0-9._/-]{1,100}$`)

// Pipeline simulates a CI/CD pipeline: build and test a ref (low risk), then
// deploy it. Deploy is critical and requires a successful build and test
// earlier in the same task (a sequential-dependency policy). Pipeline
// deliberately cannot preview, so a PREVIEW gate decision escalates to
// CONFIRM.
type Pipeline struct {
	builds atomic.Int64
	// runs counts the executions of each action.
	runs [3]atomic.Int64
}

// Runs returns how often action (build, test or deploy) was executed.
func (p *Pipeline) Runs(action string) int64 {
	if i := slices.Index(pipelineActions, action); i >= 0 {
		return p.runs[i].Load()
	}
	return 0
}

var pipelineActions = []string{"build", "test", "deploy"}

// NewPipeline returns the pipeline tool.
func NewPipeline() *Pipeline { return &Pipeline{} }

const refProperty = `"ref": {"type": "string", "pattern": "^[A-Za-z0-9._/-]{1,100}$", "description": "The git ref to use: a branch, tag or commit, such as main or v1.2.0."}`

// Definition describes the pipeline tool.
func (*Pipeline) Definition() toolkit.Definition {
	refOnly := toolkit.JSON(`{"type": "object", "properties": {` + refProperty + `}, "required": ["ref"]}`)
	return toolkit.Definition{
		Name:           "pipeline",
		Description:    "Build, test and deploy a git ref through a simulated CI/CD pipeline. Deploy requires a successful build and test earlier in the same task.",
		Capabilities:   []string{"demo", "ci"},
		RequiredScopes: []string{"pipeline"},
		DefaultRisk:    toolkit.RiskMedium,
		AuditPayloads:  true,
		Policies: []toolkit.Policy{{SequentialDependency: &toolkit.SequentialDependency{
			Action:   "deploy",
			Requires: []string{"build", "test"},
		}}},
		Actions: []toolkit.Action{
			{
				Name:        "build",
				Description: "Build a git ref and return the name of the artifact produced.",
				Risk:        toolkit.RiskLow,
				InputSchema: refOnly,
				OutputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {"artifact": {"type": "string"}},
					"required": ["artifact"]
				}`),
				Examples: []toolkit.Example{
					{Description: "Build main.", Input: toolkit.JSON(`{"ref": "main"}`), Output: toolkit.JSON(`{"artifact": "main-build-1"}`)},
				},
			},
			{
				Name:        "test",
				Description: "Run the test suite against a git ref.",
				Risk:        toolkit.RiskLow,
				InputSchema: refOnly,
				OutputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {"passed": {"type": "boolean"}},
					"required": ["passed"]
				}`),
				Examples: []toolkit.Example{
					{Description: "Test main.", Input: toolkit.JSON(`{"ref": "main"}`), Output: toolkit.JSON(`{"passed": true}`)},
				},
			},
			{
				Name:        "deploy",
				Description: "Deploy a git ref to staging or production. Requires build and test to have succeeded earlier in the task.",
				Risk:        toolkit.RiskCritical,
				InputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {
						"environment": {"type": "string", "enum": ["staging", "production"], "description": "Where to deploy."},
						` + refProperty + `
					},
					"required": ["environment", "ref"]
				}`),
				OutputSchema: toolkit.JSON(`{
					"type": "object",
					"properties": {
						"deployed": {"type": "boolean"},
						"environment": {"type": "string"},
						"ref": {"type": "string"}
					},
					"required": ["deployed", "environment", "ref"]
				}`),
				Examples: []toolkit.Example{
					{Description: "Deploy main to staging.", Input: toolkit.JSON(`{"environment": "staging", "ref": "main"}`), Output: toolkit.JSON(`{"deployed": true, "environment": "staging", "ref": "main"}`)},
				},
			},
		},
	}
}

// BuildResult is the value of build.
type BuildResult struct {
	Artifact string `json:"artifact"`
}

// TestResult is the value of test.
type TestResult struct {
	Passed bool `json:"passed"`
}

// DeployResult is the value of deploy.
type DeployResult struct {
	Deployed    bool   `json:"deployed"`
	Environment string `json:"environment"`
	Ref         string `json:"ref"`
}

// Execute runs build, test or deploy.
func (p *Pipeline) Execute(ctx context.Context, call *toolkit.Call) (*toolkit.Result, error) {
	var args struct {
		Ref         string `json:"ref"`
		Environment string `json:"environment"`
	}
	if r := bind(call, &args); r != nil {
		return r, nil
	}
	if !refPattern.MatchString(args.Ref) {
		return toolkit.Failure(fmt.Sprintf("invalid ref %q", args.Ref)), nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if i := slices.Index(pipelineActions, call.Action); i >= 0 {
		p.runs[i].Add(1)
	}
	switch call.Action {
	case "build":
		art := fmt.Sprintf("%s-build-%d", args.Ref, p.builds.Add(1))
		return toolkit.OK(BuildResult{Artifact: art}, "built "+args.Ref+": artifact "+art), nil
	case "test":
		return toolkit.OK(TestResult{Passed: true}, "all tests passed for "+args.Ref), nil
	case "deploy":
		if args.Environment != "staging" && args.Environment != "production" {
			return toolkit.Failure(fmt.Sprintf("unknown environment %q: use staging or production", args.Environment)), nil
		}
		return toolkit.OK(DeployResult{Deployed: true, Environment: args.Environment, Ref: args.Ref},
			"deployed "+args.Ref+" to "+args.Environment), nil
	}
	return nil, fmt.Errorf("pipeline: unknown action %q", call.Action)
}
