package backend

import "fmt"

// ValidateSandboxName checks a SandboxSpec.Name: 1–63 characters of a–z 0–9 _ . -,
// starting with a letter or digit. It returns an error wrapping ErrInvalid that names
// the input.
func ValidateSandboxName(name string) error {
	if len(name) == 0 || len(name) > 63 {
		return Errorf(ErrInvalid, "sandbox name %q: must be 1 to 63 characters", name)
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if i > 0 {
			ok = ok || c == '_' || c == '.' || c == '-'
		}
		if !ok {
			return Errorf(ErrInvalid, "sandbox name %q: character %d (%q) is not allowed; use a-z 0-9 _ . - and start with a letter or digit", name, i+1, fmt.Sprint(string(c)))
		}
	}
	return nil
}
