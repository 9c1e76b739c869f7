// Command toolsvc is the tool execution service: `toolsvc serve` runs the gRPC
// server, `toolsvc migrate` manages the Postgres schema, `toolsvc token`
// makes bearer tokens, `toolsvc version` says which build this is; the
// other commands are clients of a running server.
//
// It is the plain build of toolsvc: the demo tools and the configured
// connectors. A build with native tools of its own is a program like this one
// whose main passes them to toolsvc.Main (docs/native-tools.md).
package main

import "github.com/toolsvc/toolsvc"

func main() { toolsvc.Main() }
