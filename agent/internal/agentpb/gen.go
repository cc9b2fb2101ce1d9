// Package agentpb is the generated wire code of berth's exec agent protocol
// (agent.proto, package berth.agent.v1). It is internal to package agent, whose
// Client and Serve are the only ways in. Regenerate with scripts/generate.sh (or
// `go generate`, with the generators it pins on PATH) after editing agent.proto;
// .ci/run fails when the committed code is not what the .proto generates.
package agentpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative agent.proto
