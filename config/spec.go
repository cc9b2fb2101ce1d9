package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/berth-sh/berth/backend"
)

// SpecHash returns the sha256 of spec's canonical JSON with Labels and Pull left out, as 64
// lowercase hex digits: the value of backend.LabelSpecHash. Two specs that differ in anything but labels hash
// differently (empty and nil lists count as equal); encoding/json writes struct fields in declaration order and map keys
// sorted, and Rule.Spec writes Env sorted, so equal rules give equal hashes.
func SpecHash(spec backend.SandboxSpec) string {
	spec.Labels = nil
	spec.Pull = "" // when the image is fetched, not what runs
	// Empty and absent lists mean the same.
	if len(spec.Env) == 0 {
		spec.Env = nil
	}
	if len(spec.EnvAllowlist) == 0 {
		spec.EnvAllowlist = nil
	}
	if len(spec.Mounts) == 0 {
		spec.Mounts = nil
	}
	b, err := json.Marshal(spec)
	if err != nil {
		// SandboxSpec holds only strings, numbers, bools and slices of them.
		panic("config: marshal sandbox spec: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
