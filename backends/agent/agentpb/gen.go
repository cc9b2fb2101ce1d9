// Package agentpb is the generated wire code of berth's exec agent protocol
// (agent.proto, package berth.agent.v1). Regenerate with `go generate` after
// editing agent.proto; protoc, protoc-gen-go and protoc-gen-go-grpc must be on PATH.
package agentpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative agent.proto
