package server

import toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"

// executionServer serves ToolExecutionService. Until the executor lands every
// RPC answers UNIMPLEMENTED.
type executionServer struct {
	toolsvcv1.UnimplementedToolExecutionServiceServer
}
