// Package driverpb is the generated gRPC code of berth's driver plugin protocol
// (driver.proto, package berth.driver.v1, protocol version 2). Package backends is
// its only user (the package is internal to it); drivers and hosts use backends.Serve
// and backends.Launch instead, and a driver written in another language takes
// driver.proto. Regenerate with scripts/generate.sh; .ci/run fails when the
// committed code is not what the .proto generates.
package driverpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative driver.proto
