// Package apiv1 holds the wire types of berth serve's HTTP API v1 (docs/api.md,
// docs/openapi.yaml): the JSON bodies of its requests and answers, the event and
// message names of its streams, its error kinds and media types.
//
// It links nothing of berth's but package backend, so that every client of the API
// can use the types without linking the server or the registry: package server,
// which serves them, also links Prometheus' client, whose initialisers cost every
// process that links it about a millisecond at start, and the thin berth front
// (cli/front) must start faster still. The conversions from the registry's
// values into these types are package server/apiconv's. server names the types and
// constants as its own (type aliases).
package apiv1
