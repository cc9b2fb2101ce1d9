// Package apiv1 holds the wire types of berth serve's HTTP API v1 (docs/api.md,
// docs/openapi.yaml): the JSON bodies of its requests and answers, the event and
// message names of its streams, its error kinds and media types, and the
// conversions from the registry's values into them.
//
// It is its own package so that berth's CLI (a client of the API when berth serve
// runs) can use the types without linking the server: package server, which serves
// them, also links Prometheus' client, whose initialisers cost every process that
// links it about a millisecond at start. Its conversions (SessionOf, JobOf,
// PoolsOf, ExplanationOf, DriversOf) take the registry's values, so it imports
// package registry. server names the types and constants as its own (type
// aliases); the conversions are only here.
package apiv1
