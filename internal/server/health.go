package server

import toolsvcv1 "github.com/toolsvc/toolsvc/gen/toolsvc/v1"

// healthServer serves ToolHealthService. Until tool health lands every RPC
// answers UNIMPLEMENTED.
type healthServer struct {
	toolsvcv1.UnimplementedToolHealthServiceServer
}
