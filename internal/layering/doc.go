// Package layering holds no code: its test keeps berth's import layering true. Every
// package of the module belongs to one group, and a group imports only the groups
// that docs/architecture.md's first table (and DESIGN's) says it may; see
// layering_test.go. A new folder fails the test until it is given a group there.
package layering
